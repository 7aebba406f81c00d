"""The LB page's deploy panel (pages.deploy_state): it keeps polling for as long as something is on its way."""

from __future__ import annotations

import pytest

from apps.balancers.models import LoadBalancer, Region
from apps.fleets.models import ConfigRevision, Fleet, Node, Rollout
from apps.fleets.pages import deploy_state

pytestmark = pytest.mark.django_db


@pytest.fixture
def served(ops):  # type: ignore[no-untyped-def]
    """An LB at revision 2 on one fleet whose node serves revision 1 (covering the LB's revision 1), finished."""
    fleet = Fleet.objects.create(name="edge", region=Region.objects.create(slug="us-east", name="US East"))
    lb = LoadBalancer.objects.create(org=ops, name="web", fleet=fleet)
    first = ConfigRevision.objects.create(fleet=fleet, number=1, text="global\n", sha256="1" * 64, validation_ok=True,
                                          lb_revisions={str(lb.pk): 1})
    Rollout.objects.create(fleet=fleet, revision=first, status=Rollout.Status.SUCCEEDED)
    Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/tmp/n1/run",
                        config_dir="/tmp/n1/etc", applied_revision=first, status=Node.Status.UP)
    LoadBalancer.objects.filter(pk=lb.pk).update(revision=2)
    Fleet.objects.filter(pk=fleet.pk).update(desired_revision=1, change_seq=5, rendered_seq=5, reconcile_queued=False)
    lb.refresh_from_db()
    fleet.refresh_from_db()
    return lb, fleet


def test_the_panel_keeps_polling_between_a_render_and_its_rollout(served) -> None:
    """A reconcile commits its render (the change no longer unrendered, nothing queued), then makes the rollout: in
    between, the panel said nothing was happening, stopped polling, and never said done."""
    lb, fleet = served
    second = ConfigRevision.objects.create(fleet=fleet, number=2, text="global\n", sha256="2" * 64, validation_ok=True,
                                           lb_revisions={str(lb.pk): 2})

    between = deploy_state(lb, [fleet])

    assert between.live and between.fleets[0].waiting and not between.all_done

    Rollout.objects.create(fleet=fleet, revision=second, status=Rollout.Status.SUCCEEDED)
    Node.objects.filter(fleet=fleet).update(applied_revision=second)
    after = deploy_state(lb, [fleet])
    assert after.all_done and not after.live


def test_the_panel_stops_polling_for_a_refused_render_or_held_changes(served) -> None:
    lb, fleet = served
    ConfigRevision.objects.create(fleet=fleet, number=2, text="global\n", sha256="2" * 64, validation_ok=False,
                                  lb_revisions={str(lb.pk): 2})
    refused = deploy_state(lb, [fleet])
    assert not refused.live and refused.fleets[0].refused and not refused.all_done

    Fleet.objects.filter(pk=fleet.pk).update(auto_rollout=False, change_seq=6)
    fleet.refresh_from_db()
    held = deploy_state(lb, [fleet])
    assert not held.live and held.fleets[0].held
