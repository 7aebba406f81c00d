"""Per-node shares of regional capacity (apps.traffic.shares): pure, no database."""

from __future__ import annotations

import math
import random

import pytest

from apps.traffic.overflow import RegionCapacity
from apps.traffic.shares import planned_limits, region_totals, static_limits, static_steps

DIST = {("a", "b"): 20.0, ("b", "a"): 20.0, ("a", "c"): 80.0, ("c", "a"): 80.0, ("b", "c"): 60.0, ("c", "b"): 60.0}
NODES = {"a1": "a", "a2": "a", "a3": "a", "b1": "b", "b2": "b", "b3": "b"}


def cap(region: str, capacity: float | None) -> RegionCapacity:
    return RegionCapacity(region=region, healthy_members=1, max_rate_per_member=capacity)


CAPS = [cap("a", 100), cap("b", 50)]


def test_all_ingress_through_one_node_gets_the_whole_region_and_the_overflow() -> None:
    limits = planned_limits(CAPS, NODES, {"a1": 150.0}, DIST, "waterfall")[0]
    assert limits["a1"]["a"] == 100 and limits["a1"]["b"] == 50  # the planner's 100 local / 50 out
    assert limits["a2"]["a"] == 0 and limits["b1"]["b"] == 0
    assert region_totals(limits) == {"a": 100, "b": 50}


def test_skew_80_20_splits_each_region_in_proportion_to_its_nodes_demand() -> None:
    limits = planned_limits(CAPS, NODES, {"a1": 80.0, "a2": 20.0, "b1": 10.0}, DIST, "waterfall")[0]
    assert limits["a1"]["a"] == 80 and limits["a2"]["a"] == 20
    # a is full, so 10% of its nodes' demand is headroom in b; b's other spare (30) stays with b's own
    # nodes, whose demand is on b1.
    assert limits["a1"]["b"] == 8 and limits["a2"]["b"] == 2
    assert limits["b1"]["b"] == 40 and limits["b2"]["b"] == 0


def test_a_region_at_its_capacity_gets_headroom_in_the_next_region_not_503s() -> None:
    """GIVEN all of a's 100 req/s capacity arriving at a1 (1x) and b idle THEN a1 may send 10% of its
    demand to b: a rate counter right at its limit jitters over it, and with no share in b those
    requests were answered 503 (make bench-overflow-fleet: 13 of ~470 at 1x) while b stood idle.
    Below 90% of a's capacity a1 gets none: b's spare stays with b's own nodes."""
    limits = planned_limits(CAPS, NODES, {"a1": 100.0}, DIST, "waterfall")[0]
    assert limits["a1"] == {"a": 100, "b": 10}
    assert region_totals(limits)["b"] == 50
    assert planned_limits(CAPS, NODES, {"a1": 89.0}, DIST, "waterfall")[0]["a1"]["b"] == 0


def test_flooring_each_node_does_not_lose_the_region_capacity() -> None:
    """GIVEN region a's 38.7 req/s and 3 of its nodes each offered 15.5 req/s (more than a third)
    THEN a's nodes together get 38 (not 12+12+12 = 36: 7% of the region left idle)."""
    caps = [RegionCapacity(region="a", healthy_members=3, max_rate_per_member=12.9), cap("b", 50)]
    limits = planned_limits(caps, NODES, {"a1": 15.5, "a2": 15.5, "a3": 15.5}, DIST, "waterfall")[0]
    assert region_totals(limits)["a"] == 38
    assert sorted(limits[n]["a"] for n in ("a1", "a2", "a3")) == [12, 13, 13]


def test_a_small_overflow_gets_headroom_from_the_neighbours_spare() -> None:
    limits = planned_limits(CAPS, NODES, {"a1": 110.0}, DIST, "waterfall")[0]
    assert limits["a1"]["b"] == 11  # 10 planned + 10% headroom
    assert region_totals(limits)["b"] <= 50


def test_static_floor_share_splits_a_region_among_its_own_nodes_only() -> None:
    limits = static_limits(CAPS, NODES, DIST, "waterfall")
    assert limits["a1"] == {"a": 33, "b": 0} and limits["b1"] == {"b": 16, "a": 0}
    # A region with no node of its own is shared by every node that reaches it.
    limits = static_limits([cap("a", 100), cap("c", 60)], {"a1": "a", "a2": "a"}, DIST, "waterfall")
    assert limits["a1"] == {"a": 50, "c": 30}
    assert static_steps(CAPS, "a", DIST, "waterfall", {"a": 3, "b": 3}) == [("a", 33), ("b", 0)]


def test_float_noise_in_a_capacity_does_not_lose_a_request_per_second() -> None:
    """10 members x 7 req/s x scaler 0.7 is 48.99999999999999 in floating point; the node gets 49."""
    pool = [RegionCapacity(region="a", healthy_members=10, max_rate_per_member=7.0, capacity_scaler=0.7)]
    assert static_limits(pool, {"a1": "a"}, DIST, "waterfall") == {"a1": {"a": 49}}


def test_unlimited_regions_are_unlimited() -> None:
    limits = planned_limits([cap("a", None), cap("b", 50)], NODES, {"a1": 10.0}, DIST, "waterfall")[0]
    assert limits["a1"] == {"a": None}


@pytest.mark.parametrize("seed", range(40))
def test_shares_of_a_region_never_sum_above_its_capacity(seed: int) -> None:
    rng = random.Random(seed)
    caps = [cap(r, rng.choice([0, 0.5, 7, 33.3, 100, 1000])) for r in ("a", "b", "c")]
    nodes = {f"{r}{i}": r for r in ("a", "b", "c") for i in range(rng.randint(0, 4))}
    demand = {n: rng.choice([0.0, 0.3, 5.0, 49.9, 500.0]) for n in nodes}
    for limits in (planned_limits(caps, nodes, demand, DIST, "waterfall")[0],
                   static_limits(caps, nodes, DIST, "waterfall")):
        for region, total in region_totals(limits).items():
            capacity = next(c.capacity for c in caps if c.region == region)
            assert total is not None and total <= math.floor(capacity + 1e-6), (region, total, capacity)
