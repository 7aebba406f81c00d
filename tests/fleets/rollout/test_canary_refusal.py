"""A revision a watched canary refused is sent again by nobody but a person: not the periodic converge (the
other nodes' results are "skipped", which the converge does not count as a refusal), not a re-render that
finds it unchanged."""

from __future__ import annotations

import pytest

from apps.balancers.models import Region
from apps.fleets import services
from apps.fleets.models import ConfigRevision, Fleet, Node, NodeResult, Rollout

pytestmark = pytest.mark.django_db


def test_the_converge_leaves_a_revision_the_canary_refused_alone():
    fleet = Fleet.objects.create(name="edge", region=Region.objects.get_or_create(slug="us-east")[0])
    good = ConfigRevision.objects.create(fleet=fleet, number=1, text="", sha256="1" * 64, validation_ok=True)
    refused = ConfigRevision.objects.create(fleet=fleet, number=2, text="", sha256="2" * 64, validation_ok=True)
    nodes = [Node.objects.create(fleet=fleet, name=f"n{i}", address=f"10.0.0.{i}", runtime_dir="/r", config_dir="/c",
                                 applied_revision=good, status=Node.Status.UP) for i in (1, 2)]
    rollout = Rollout.objects.create(fleet=fleet, revision=refused, from_revision=0, status=Rollout.Status.FAILED,
                                     stopped_by_canary=True)
    for node in nodes:
        NodeResult.objects.create(rollout=rollout, node=node, status=NodeResult.Status.SKIPPED)
    Fleet.objects.filter(pk=fleet.pk).update(desired_revision=2)  # the first rollout: nothing to go back to
    assert services.fleet_converge(fleet=fleet, check_drift=False, enqueue=False) is None
    Rollout.objects.filter(pk=rollout.pk).update(stopped_by_canary=False)  # the same, unrefused: converged
    assert services.fleet_converge(fleet=fleet, check_drift=False, enqueue=False) is not None
