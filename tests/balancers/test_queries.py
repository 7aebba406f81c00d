"""apps.balancers.queries.free_priority: the database finds the same free priority routing.default_priority picks
from every number the org holds on the LB (the pure rule: tests/balancers/test_routing.py), for random holdings
around the band, for a route that keeps its own number, and past a full band."""

from __future__ import annotations

import random

import pytest

from apps.balancers import routing
from apps.balancers.models import Route
from apps.balancers.queries import free_priority
from tests.factories import LoadBalancerFactory

pytestmark = pytest.mark.django_db

PATHS = [("/", "prefix"), ("/api", "prefix"), ("/api", "exact"), ("/api/v1/users", "prefix"), ("/x" * 30, "exact")]


def _hold(lb, org, priorities) -> list[Route]:
    Route.objects.filter(lb=lb).delete()
    return Route.objects.bulk_create([Route(lb=lb, org=org, hosts=[], path=f"/held{p}", priority=p)
                                      for p in sorted(priorities)], batch_size=5_000)


def test_the_database_picks_what_default_priority_picks_for_random_holdings(alice, charlie) -> None:
    lb = LoadBalancerFactory(org=alice.org)
    rng = random.Random(40)
    for trial in range(40):
        path, match = rng.choice(PATHS)
        base = routing.priority_base(path, match)
        held = {p for p in range(base - 25, base + 25) if rng.random() < rng.choice([0.3, 0.8, 1.0])}
        rows = _hold(lb, alice.org, held)
        # Another tenant's numbers on the same LB take nothing from this one (priorities are per org).
        Route.objects.create(lb=lb, org=charlie.org, hosts=["c.test"], path="/c", priority=base)
        wanted = routing.default_priority(path, match, held)
        assert free_priority(Route(lb=lb, org=alice.org, path=path, path_match=match)) == wanted, trial
        if rows:  # an update of a held route: its own number is free to it
            mine = rng.choice(rows)
            again = routing.default_priority(path, match, held - {mine.priority})
            assert free_priority(Route(pk=mine.pk, lb=lb, org=alice.org, path=path, path_match=match)) == again, trial


def test_past_a_full_band_it_goes_below_it(alice) -> None:
    lb = LoadBalancerFactory(org=alice.org)
    base = routing.priority_base("/api", "prefix")
    _hold(lb, alice.org, range(base, routing.MAX_PRIORITY + 1))
    assert free_priority(Route(lb=lb, org=alice.org, path="/api", path_match="prefix")) == base - 1
