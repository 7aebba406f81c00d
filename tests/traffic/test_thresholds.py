"""Overflow chains (apps.traffic.thresholds.region_chain): the order in which a node of one region walks a pool's
regions. The per-node limits on each step are apps.traffic.shares' (tests/traffic/test_shares.py)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.traffic.overflow import (
    ISOLATION,
    SPRAY_TO_WORLD,
    WATERFALL,
    PlanInputError,
    Policy,
    RegionCapacity,
    capacity_by_region,
    region_order,
)
from apps.traffic.thresholds import region_chain

DISTANCES = {("a", "b"): 10.0, ("a", "c"): 50.0, ("b", "c"): 40.0}


def cap(region: str, capacity_rps: float | None, *, scaler: float = 1.0) -> RegionCapacity:
    return RegionCapacity(region, 1, capacity_rps, scaler)


def chain(pool: list[RegionCapacity], region: str, policy: Policy = WATERFALL) -> list[str]:
    return region_chain(region, capacity_by_region(pool), DISTANCES, policy)


def test_chain_runs_nearest_first_from_each_region() -> None:
    pool = [cap("c", 100), cap("b", 100), cap("a", 100)]
    assert chain(pool, "a") == ["a", "b", "c"]
    assert chain(pool, "c") == ["c", "b", "a"]
    assert chain(pool, "a", SPRAY_TO_WORLD) == ["a", "b", "c"]  # the spray policies walk the same chain


def test_drained_and_dead_regions_are_skipped() -> None:
    pool = [cap("a", 100), cap("b", 100, scaler=0.0), RegionCapacity("c", 0, 50.0, 1.0)]
    assert chain(pool, "a") == ["a"]
    # A node in a drained region starts its chain at the nearest region that has capacity.
    assert chain(pool, "b") == ["a"]


def test_no_capacity_anywhere_gives_an_empty_chain() -> None:
    assert chain([cap("a", 0), cap("b", 100, scaler=0.0)], "a") == []


def test_an_unlimited_region_ends_the_chain() -> None:
    assert chain([cap("a", 100), cap("b", None), cap("c", 100)], "a") == ["a", "b"]


def test_isolation_is_a_single_step_without_fallback() -> None:
    assert chain([cap("a", 100), cap("b", 300)], "a", ISOLATION) == ["a"]
    assert chain([cap("a", 0), cap("b", 300)], "a", ISOLATION) == []


def test_an_unknown_policy_is_refused() -> None:
    with pytest.raises(PlanInputError) as err:
        chain([cap("a", 10)], "a", "spray")  # type: ignore[arg-type]
    assert err.value.code == "invalid_policy"


# --- properties -------------------------------------------------------------------------

REGIONS = ["a", "b", "c", "d"]
Fleet = tuple[list[RegionCapacity], dict[tuple[str, str], float], dict[str, int]]


_PAIRS = [(x, y) for i, x in enumerate(REGIONS) for y in REGIONS[i + 1 :]]
# Built once, not on every draw (see traffickit's scenarios).
_POOL_REGIONS = st.lists(st.sampled_from(REGIONS), min_size=1, max_size=4, unique=True)
_HEALTHY = st.integers(0, 5)
_ONE_IN_TEN = st.integers(0, 9)
_PER_MEMBER = st.floats(0, 500)
_SCALER = st.sampled_from([0.0, 0.1, 0.5, 1.0])
_DISTANCES = st.dictionaries(st.sampled_from(_PAIRS), st.integers(1, 5).map(float))
_NODES = st.dictionaries(st.sampled_from(REGIONS), st.integers(0, 6), min_size=1)


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    pool_regions = draw(_POOL_REGIONS)
    pool = [
        RegionCapacity(
            region,
            draw(_HEALTHY),
            None if draw(_ONE_IN_TEN) == 0 else draw(_PER_MEMBER),
            draw(_SCALER),
        )
        for region in pool_regions
    ]
    distances = draw(_DISTANCES)
    nodes = draw(_NODES)
    return pool, distances, nodes


@settings(max_examples=300, deadline=None)
@given(fleets(), st.sampled_from([WATERFALL, ISOLATION]))
def test_chain_is_nearest_first_over_regions_with_capacity(fleet: Fleet, policy: Policy) -> None:
    pool, distances, nodes = fleet
    capacity = capacity_by_region(pool)
    for region, count in nodes.items():
        if count == 0:
            continue
        regions = region_chain(region, capacity, distances, policy)
        assert all(capacity[target] > 0 for target in regions)
        order = region_order(region, capacity, distances)
        assert regions == sorted(regions, key=order.index)
        assert all(capacity[target] != float("inf") for target in regions[:-1])  # unlimited ends it
        if policy == WATERFALL:  # every region with capacity up to the first unlimited one
            reachable = [r for r in order if capacity.get(r, 0) > 0]
            cut = next((i for i, r in enumerate(reachable) if capacity[r] == float("inf")), len(reachable) - 1)
            assert regions == reachable[:cut + 1]
        if policy == ISOLATION:
            assert regions in ([], [region])
