"""The reconcile loop's reads of its fleet and active rollouts, compiled once (apps.core.prepared), answer as the ORM's
querysets do, with the related objects and deferred fields execute relies on."""

from __future__ import annotations

import pytest
from django.db import connection

from apps.balancers.models import Region
from apps.fleets.models import ConfigRevision, Fleet, Rollout
from apps.fleets.rollout import reconcile

pytestmark = pytest.mark.django_db


def test_the_reconcile_loops_reads_answer_as_the_orm_with_related_and_deferred_fields() -> None:
    """The fleet (with its region) and its active rollouts (with fleet and revision, the revision's bulk fields
    deferred) as apps.fleets.rollout.reconcile reads them on every pass."""
    fleet = Fleet.objects.create(name="edge", region=Region.objects.create(slug="us-east", name="US East"))
    other = Fleet.objects.create(name="other", region=Region.objects.create(slug="eu-west", name="EU West"))
    revisions = [ConfigRevision.objects.create(fleet=f, number=n, text="global\n", sha256=str(n) * 64,
                                               validation_ok=True, snapshot={"n": n}, lb_revisions={"1": n})
                 for n, f in ((1, fleet), (2, fleet), (3, other))]
    Rollout.objects.create(fleet=fleet, revision=revisions[0], status=Rollout.Status.RUNNING)
    Rollout.objects.create(fleet=fleet, revision=revisions[1])
    Rollout.objects.create(fleet=fleet, revision=revisions[1], status=Rollout.Status.SUCCEEDED)
    Rollout.objects.create(fleet=other, revision=revisions[2])

    def seen(rollouts: list[Rollout]) -> list[tuple]:
        return [(r.pk, r.status, r.fleet.name, r.fleet.change_seq, r.revision.number, r.revision.sha256,
                 r.revision.get_deferred_fields()) for r in rollouts]

    for f in (fleet, other):
        prepared = reconcile._ACTIVE_ROLLOUTS.all(fleet_id=f.pk)
        assert prepared and seen(prepared) == seen(list(reconcile._active_rollouts(f.pk)))
        assert "text" in prepared[0].revision.get_deferred_fields()
        assert prepared[0].revision.snapshot == {"n": prepared[0].revision.number}  # deferred, read on access
        read = reconcile._FLEET.first(fleet_id=f.pk)
        assert (read.pk, read.name, read.region.slug) == (f.pk, f.name, f.region.slug)
    assert [r.revision.number for r in reconcile._ACTIVE_ROLLOUTS.all(fleet_id=fleet.pk)] == [2, 1]  # newest first
    assert reconcile._FLEET.first(fleet_id=other.pk + 1000) is None
    if connection.vendor == "postgresql":
        assert reconcile._FLEET._prepared("default") and reconcile._ACTIVE_ROLLOUTS._prepared("default")
