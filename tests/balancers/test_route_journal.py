"""The route journal: every route write through the API records which routes its LB revision changed, and
nothing else does, so a fleet's route lane (apps.fleets.config.routelane) applies exactly those routes."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from apps.balancers import services
from apps.balancers.models import LoadBalancer, Route, RouteChange
from apps.balancers.signals import lb_changed

pytestmark = pytest.mark.django_db


def _journal(lb: LoadBalancer) -> list[tuple[int, int]]:
    return list(RouteChange.objects.filter(lb=lb).order_by("lb_revision").values_list("lb_revision", "route_id"))


def _revision(lb: LoadBalancer) -> int:
    return LoadBalancer.objects.values_list("revision", flat=True).get(pk=lb.pk)


def test_route_create_update_delete_through_the_api_journal_the_route_at_its_revision(
    world, alice, django_capture_on_commit_callbacks
) -> None:
    sent: list[dict] = []

    def listen(sender, **kwargs) -> None:  # type: ignore[no-untyped-def]
        sent.append(kwargs)

    lb_changed.connect(listen, dispatch_uid="test_route_journal")
    try:
        with django_capture_on_commit_callbacks(execute=True):
            created = alice.client.post("/api/v1/routes/", {
                "lb": world.acme_lb.pk, "path": "/api", "priority": 5,
                "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}, format="json")
        assert created.status_code == 201, created.content
        route_id = created.json()["id"]
        assert _journal(world.acme_lb) == [(_revision(world.acme_lb), route_id)]
        with django_capture_on_commit_callbacks(execute=True):
            assert alice.client.patch(f"/api/v1/routes/{route_id}/", {"path": "/v2"},
                                      format="json").status_code == 200
        with django_capture_on_commit_callbacks(execute=True):
            assert alice.client.delete(f"/api/v1/routes/{route_id}/").status_code == 204
        revision = _revision(world.acme_lb)
        assert _journal(world.acme_lb) == [(revision - 2, route_id), (revision - 1, route_id), (revision, route_id)]
        assert [s["routes_only"] for s in sent] == [True, True, True]

        # A pool change is no route change: no journal row, and the signal says so.
        with django_capture_on_commit_callbacks(execute=True):
            assert alice.client.patch(f"/api/v1/pools/{world.acme_pool.pk}/", {"algorithm": "leastconn"},
                                      format="json").status_code == 200
        assert len(_journal(world.acme_lb)) == 3 and _revision(world.acme_lb) == revision + 1
        assert sent[-1]["routes_only"] is False
    finally:
        lb_changed.disconnect(dispatch_uid="test_route_journal")


def test_a_refused_route_write_journals_nothing(world, alice, charlie) -> None:
    before = _revision(world.acme_lb)
    refused = charlie.client.post("/api/v1/routes/", {
        "lb": world.acme_lb.pk, "path": "/x", "priority": 1,
        "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}, format="json")
    assert refused.status_code in (400, 404)
    assert _journal(world.acme_lb) == [] and _revision(world.acme_lb) == before
    assert not Route.objects.filter(path="/x").exists()


def test_old_journal_rows_are_pruned(world) -> None:
    services.lb_touch(world.acme_lb.pk, route_ids=[1])
    services.lb_touch(world.acme_lb.pk, route_ids=[2])
    RouteChange.objects.filter(route_id=1).update(created_at=timezone.now() - dt.timedelta(hours=2))
    assert services.route_changes_prune() == 1
    assert [r for _, r in _journal(world.acme_lb)] == [2]
