"""A route write reads the routes it is checked against before its LB's lock (route_rules.early_peers) and keeps that
read under the lock only when no route written since concerns it, as the journal (RouteChange) names them; else it
reads them again there. These tests put a write between the two steps, as a concurrent writer would
(tests/balancers/test_route_races.py sends real concurrent writes), and check the verdict and which reads ran.
"""

from __future__ import annotations

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from apps.balancers.models import LoadBalancer, Route
from apps.balancers.route_rules import check_peers, early_peers
from apps.balancers.services import lb_touch
from apps.core.errors import Conflict, DomainError

pytestmark = pytest.mark.django_db

HOST = "acme.example.com"


@pytest.fixture(autouse=True)
def _postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("the early read is made on PostgreSQL only (SQLite reads under the lock)")


def _draft(world, alice, path: str, priority: int) -> Route:
    return Route(lb=world.acme_lb, org=alice.org, hosts=[HOST], path=path, path_match="prefix", priority=priority)


def _write(world, alice, path: str, priority: int) -> None:
    created = alice.client.post("/api/v1/routes/", {
        "lb": world.acme_lb.pk, "hosts": [HOST], "path": path, "priority": priority,
        "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}, format="json")
    assert created.status_code == 201, created.content


def _check_under_lock(alice, route: Route, early) -> list[str]:
    """check_peers as route_save runs it: under the LB's row lock, at the revision read with it. The peer reads it
    made (the statements loading routes by their rule columns)."""
    principal = alice.principal
    with transaction.atomic(), CaptureQueriesContext(connection) as queries:
        revision = LoadBalancer.objects.select_for_update().values_list("revision", flat=True).get(pk=route.lb_id)
        check_peers(principal, route, early, revision)
    return [q["sql"] for q in queries.captured_queries if '"balancers_route"."path_match" AS' in q["sql"]]


def test_a_route_written_after_the_early_read_that_would_cover_it_is_seen_under_the_lock(world, alice):
    route = _draft(world, alice, "/shop/cart", 2001)
    early = early_peers(route)
    assert early is not None and early.rows == []
    _write(world, alice, "/shop", 2000)  # covers every request of /shop/cart first
    with pytest.raises(DomainError) as refused:
        _check_under_lock(alice, route, early)
    assert refused.value.code == "route_shadowed"


def test_a_route_written_after_the_early_read_with_its_priority_is_seen_under_the_lock(world, alice):
    route = _draft(world, alice, "/a", 3000)
    early = early_peers(route)
    _write(world, alice, "/b", 3000)
    with pytest.raises(Conflict) as refused:
        _check_under_lock(alice, route, early)
    assert refused.value.code == "priority_taken"


def test_an_unrelated_route_written_meanwhile_keeps_the_early_read_and_no_peer_read_runs_under_the_lock(
        world, alice):
    _write(world, alice, "/shop", 2000)
    route = _draft(world, alice, "/shop/cart", 1999)  # ranks first: /shop does not cover it
    early = early_peers(route)
    assert [row.path for row, *_ in early.rows] == ["/shop"]
    _write(world, alice, "/elsewhere", 4000)  # another path line, another priority
    assert _check_under_lock(alice, route, early) == []
    assert _check_under_lock(alice, route, early_peers(route)) == []  # nothing written since


def test_a_peer_deleted_meanwhile_is_read_again_under_the_lock(world, alice):
    _write(world, alice, "/shop", 2000)
    route = _draft(world, alice, "/shop/cart", 2001)
    early = early_peers(route)
    assert [row.path for row, *_ in early.rows] == ["/shop"]  # the early read alone would refuse it
    covering = Route.objects.get(lb=world.acme_lb, path="/shop")
    assert alice.client.delete(f"/api/v1/routes/{covering.pk}/").status_code == 204
    reads = _check_under_lock(alice, route, early)  # no longer shadowed: no error
    assert len(reads) == 1


def test_a_bump_the_journal_does_not_name_reads_the_routes_again_under_the_lock(world, alice):
    """A revision bumped without the routes it changed (lb_touch with no route_ids: a pool or listener change, or a
    route written outside route_save) may hide any route change: the early read is not trusted past it."""
    route = _draft(world, alice, "/shop/cart", 2001)
    early = early_peers(route)
    with transaction.atomic():
        Route.objects.create(lb=world.acme_lb, org=alice.org, hosts=[HOST], path="/shop", path_match="prefix",
                             priority=2000)
        lb_touch(world.acme_lb.pk)
    with pytest.raises(DomainError) as refused:
        _check_under_lock(alice, route, early)
    assert refused.value.code == "route_shadowed"


def test_saving_an_lb_read_before_a_bump_never_sets_its_revision_back(world, alice):
    """A config-code apply updates an LB it read without its lock (object_save): the revision a route write compares
    (and the fleets' journal readers follow) keeps growing."""
    from apps.balancers.services import object_save

    stale = LoadBalancer.objects.get(pk=world.acme_lb.pk)
    lb_touch(world.acme_lb.pk)
    bumped = LoadBalancer.objects.values_list("revision", flat=True).get(pk=world.acme_lb.pk)
    assert bumped == stale.revision + 1
    principal = alice.principal
    object_save(principal=principal, obj=stale, data={"name": "acme-renamed"})
    assert LoadBalancer.objects.values_list("name", "revision").get(pk=world.acme_lb.pk) == ("acme-renamed", bumped)


def test_an_lb_loaded_with_some_fields_saves_those_and_reads_nothing_more(world):
    partial = LoadBalancer.objects.only("id", "name").get(pk=world.acme_lb.pk)
    partial.name = "acme-partial"
    with CaptureQueriesContext(connection) as queries:
        partial.save()
    assert [q["sql"].split()[0] for q in queries.captured_queries] == ["UPDATE"]
    assert LoadBalancer.objects.get(pk=world.acme_lb.pk).name == "acme-partial"
