"""Route writes that race: the rules spanning routes hold when two writes of one LB arrive at once.

Every route write of an LB is checked and written under the LB's lock (services.route_save): these tests send two
conflicting writes through the API at the same instant, many times, on PostgreSQL, and expect exactly one of them
to land each time, with the coded answer a single writer gets.
"""

from __future__ import annotations

import threading

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.balancers.models import Route

ROUNDS = 12


def _race(persona, bodies: list[dict]) -> list[tuple[int, dict]]:
    """POST each body from its own thread and connection, released together."""
    barrier = threading.Barrier(len(bodies))
    results: list[tuple[int, dict]] = [(0, {})] * len(bodies)

    def post(i: int) -> None:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {persona.token}")
        try:
            barrier.wait(10)
            response = client.post("/api/v1/routes/", bodies[i], format="json")
            results[i] = (response.status_code, response.json())
        finally:
            connection.close()

    threads = [threading.Thread(target=post, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return results


def _body(world, path: str, priority: int, *, match: str = "prefix", host: str = "acme.example.com") -> dict:
    return {"lb": world.acme_lb.pk, "hosts": [host], "path": path, "path_match": match, "priority": priority,
            "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}


def _one_landed(results: list[tuple[int, dict]], codes: set[str]) -> None:
    statuses = sorted(status for status, _ in results)
    assert statuses[0] == 201 and statuses[1] in (409, 422), results
    refused = next(body for status, body in results if status != 201)
    assert refused["code"] in codes, refused


@pytest.fixture
def postgres_only():
    if connection.vendor != "postgresql":
        pytest.skip("row locks and concurrent transactions are measured on PostgreSQL")


@pytest.mark.django_db(transaction=True)
def test_two_routes_with_one_priority_at_once_one_lands_and_the_other_is_told_priority_taken(
        postgres_only, world, alice, bob):
    for i in range(ROUNDS):
        results = _race(alice, [_body(world, f"/a{i}", 100 + i), _body(world, f"/b{i}", 100 + i)])
        _one_landed(results, {"priority_taken"})
    assert Route.objects.filter(lb=world.acme_lb).count() == ROUNDS


@pytest.mark.django_db(transaction=True)
def test_two_writes_of_the_same_host_path_and_match_at_once_one_lands(postgres_only, world, alice):
    for i in range(ROUNDS):
        results = _race(alice, [_body(world, f"/same{i}", 1000 + 2 * i, match="exact"),
                                _body(world, f"/same{i}", 1001 + 2 * i, match="exact")])
        _one_landed(results, {"route_conflict"})
    assert Route.objects.filter(lb=world.acme_lb, path__startswith="/same").count() == ROUNDS


@pytest.mark.django_db(transaction=True)
def test_a_route_and_the_route_that_would_shadow_it_at_once_never_both_land(postgres_only, world, alice):
    """`/s<i>` at a better priority covers every request of `/s<i>/x`: whichever commits second is refused
    (route_shadowed for the covered route, route_shadows for the covering one), so no route is left that can
    never serve a request."""
    for i in range(ROUNDS):
        results = _race(alice, [_body(world, f"/s{i}", 2000 + 2 * i), _body(world, f"/s{i}/x", 2001 + 2 * i)])
        _one_landed(results, {"route_shadowed", "route_shadows"})
    assert Route.objects.filter(lb=world.acme_lb, path__startswith="/s").count() == ROUNDS


@pytest.mark.django_db(transaction=True)
def test_a_named_priority_and_the_same_default_priority_at_once_never_deadlock(postgres_only, world, alice):
    """One write names priority P, the other names none and would pick P by default (same path length). Whichever
    takes the LB's lock first gets P: the unnamed one always lands (with P, or a free one after the named one), the
    named one lands or is told priority_taken; never a 500 (a write waiting on another's uncommitted priority while
    holding the lock would deadlock)."""
    from apps.balancers.routing import default_priority

    for i in range(ROUNDS):
        path, other = f"/d{i:03d}", f"/e{i:03d}"
        taken = set(Route.objects.filter(lb=world.acme_lb, org=alice.org).values_list("priority", flat=True))
        named = _body(world, path, default_priority(other, "prefix", taken))
        unnamed = {k: v for k, v in _body(world, other, 0).items() if k != "priority"}
        (named_status, named_body), (unnamed_status, unnamed_body) = _race(alice, [named, unnamed])
        assert unnamed_status == 201, unnamed_body
        assert named_status == 201 or (named_status == 409 and named_body["code"] == "priority_taken"), named_body
        if named_status == 201:
            assert unnamed_body["priority"] != named_body["priority"]
