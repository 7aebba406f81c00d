"""Per-node overflow chains: the N each HAProxy node compares `be_sess_rate` with, per region."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.traffic.overflow import ISOLATION, WATERFALL, PlanInputError, Policy, RegionCapacity, region_order
from apps.traffic.thresholds import node_chain

DISTANCES = {("a", "b"): 10.0, ("a", "c"): 50.0, ("b", "c"): 40.0}


def cap(region: str, capacity_rps: float | None, *, scaler: float = 1.0) -> RegionCapacity:
    return RegionCapacity(region, 1, capacity_rps, scaler)


def test_each_node_gets_its_share_of_every_region_and_the_last_step_takes_the_rest() -> None:
    """A: 100 req/s, B: 300 req/s; 2 nodes in A and 3 in B may all send to both -> 100/5, 300/5."""
    pool = [cap("a", 100), cap("b", 300)]
    nodes = {"a": 2, "b": 3}
    assert node_chain(pool, "a", DISTANCES, WATERFALL, nodes) == [("a", 20), ("b", None)]
    assert node_chain(pool, "b", DISTANCES, WATERFALL, nodes) == [("b", 60), ("a", None)]


def test_shed_keeps_a_limit_on_the_last_step() -> None:
    pool = [cap("a", 100), cap("b", 300)]
    chain = node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 2, "b": 3}, overload="shed")
    assert chain == [("a", 20), ("b", 60)]


def test_chain_runs_nearest_first() -> None:
    pool = [cap("c", 100), cap("b", 100), cap("a", 100)]
    chain = node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 1}, overload="shed")
    assert [region for region, _ in chain] == ["a", "b", "c"]


def test_pool_region_without_a_fleet_is_shared_only_by_the_nodes_that_overflow_into_it() -> None:
    """C has the pool but no HAProxy nodes: A's 4 nodes are the only senders to C."""
    pool = [cap("a", 40), cap("c", 200)]
    assert node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 4}, overload="shed") == [("a", 10), ("c", 50)]


def test_drained_and_dead_regions_are_skipped() -> None:
    pool = [cap("a", 100), cap("b", 100, scaler=0.0), RegionCapacity("c", 0, 50.0, 1.0)]
    assert node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 1, "b": 1}) == [("a", None)]
    # A node in a drained region starts its chain at the nearest region that has capacity.
    assert node_chain(pool, "b", DISTANCES, WATERFALL, {"a": 1, "b": 1}) == [("a", None)]


def test_no_capacity_anywhere_gives_an_empty_chain() -> None:
    pool = [cap("a", 0), cap("b", 100, scaler=0.0)]
    assert node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 1}) == []


def test_unlimited_region_has_no_limit_and_ends_the_chain() -> None:
    pool = [cap("a", 100), cap("b", None), cap("c", 100)]
    assert node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 2}, overload="shed") == [("a", 50), ("b", None)]


def test_isolation_is_a_single_step_without_fallback() -> None:
    pool = [cap("a", 100), cap("b", 300)]
    nodes = {"a": 2, "b": 3}
    assert node_chain(pool, "a", DISTANCES, ISOLATION, nodes) == [("a", None)]
    # Under isolation only A's own 2 nodes send to A.
    assert node_chain(pool, "a", DISTANCES, ISOLATION, nodes, overload="shed") == [("a", 50)]
    assert node_chain([cap("a", 0), cap("b", 300)], "a", DISTANCES, ISOLATION, nodes) == []


def test_share_is_rounded_down_so_the_shares_never_add_up_past_capacity() -> None:
    pool = [cap("a", 100), cap("b", 1000)]
    chain = node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 3}, overload="shed")
    assert chain == [("a", 33), ("b", 333)]


def test_float_noise_in_capacity_does_not_lose_a_request_per_second() -> None:
    """10 members x 7 req/s x 0.7 is 48.99999999999999 in floating point; the node gets 49."""
    pool = [RegionCapacity("a", 10, 7.0, 0.7)]
    assert node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 1}, overload="shed") == [("a", 49)]


def test_step_whose_share_rounds_to_zero_is_left_out() -> None:
    """5 req/s shared by 10 nodes is 0 per node: `be_sess_rate lt 0` would never match."""
    pool = [cap("a", 5), cap("b", 1000)]
    assert node_chain(pool, "a", DISTANCES, WATERFALL, {"a": 10}, overload="shed") == [("b", 100)]


def test_asking_node_must_be_counted_in_its_region() -> None:
    with pytest.raises(PlanInputError) as err:
        node_chain([cap("a", 10)], "a", DISTANCES, WATERFALL, {"b": 3})
    assert err.value.code == "unknown_fleet_region"


def test_unknown_policy_or_overload_mode_is_refused() -> None:
    with pytest.raises(PlanInputError) as err:
        node_chain([cap("a", 10)], "a", DISTANCES, "spray", {"a": 1})  # type: ignore[arg-type]
    assert err.value.code == "invalid_policy"
    with pytest.raises(PlanInputError) as err:
        node_chain([cap("a", 10)], "a", DISTANCES, WATERFALL, {"a": 1}, overload="drop")  # type: ignore[arg-type]
    assert err.value.code == "invalid_overload"


# --- properties -------------------------------------------------------------------------

REGIONS = ["a", "b", "c", "d"]
Fleet = tuple[list[RegionCapacity], dict[tuple[str, str], float], dict[str, int]]


@st.composite
def fleets(draw: st.DrawFn) -> Fleet:
    pool_regions = draw(st.lists(st.sampled_from(REGIONS), min_size=1, max_size=4, unique=True))
    pool = [
        RegionCapacity(
            region,
            draw(st.integers(0, 5)),
            None if draw(st.integers(0, 9)) == 0 else draw(st.floats(0, 500)),
            draw(st.sampled_from([0.0, 0.1, 0.5, 1.0])),
        )
        for region in pool_regions
    ]
    pairs = [(x, y) for i, x in enumerate(REGIONS) for y in REGIONS[i + 1 :]]
    distances = draw(st.dictionaries(st.sampled_from(pairs), st.integers(1, 5).map(float)))
    nodes = draw(st.dictionaries(st.sampled_from(REGIONS), st.integers(0, 6), min_size=1))
    return pool, distances, nodes


@settings(max_examples=300, deadline=None)
@given(fleets(), st.sampled_from([WATERFALL, ISOLATION]))
def test_all_nodes_at_their_limits_never_exceed_a_regions_capacity(fleet: Fleet, policy: Policy) -> None:
    pool, distances, nodes = fleet
    capacity = {c.region: c.capacity for c in pool}
    sent = dict.fromkeys(capacity, 0.0)
    for region, count in nodes.items():
        if count == 0:
            continue
        for target, limit in node_chain(pool, region, distances, policy, nodes, overload="shed"):
            sent[target] += count * (float("inf") if limit is None else limit)
    for region, total in sent.items():
        assert total <= capacity[region] * (1 + 1e-9), region


@settings(max_examples=300, deadline=None)
@given(fleets(), st.sampled_from([WATERFALL, ISOLATION]))
def test_chain_is_nearest_first_over_regions_with_capacity(fleet: Fleet, policy: Policy) -> None:
    pool, distances, nodes = fleet
    capacity = {c.region: c.capacity for c in pool}
    for region, count in nodes.items():
        if count == 0:
            continue
        chain = node_chain(pool, region, distances, policy, nodes)
        regions = [target for target, _ in chain]
        assert all(capacity[target] > 0 for target in regions)
        order = region_order(region, capacity, distances)
        assert regions == sorted(regions, key=order.index)
        if chain:
            assert chain[-1][1] is None
        if policy == ISOLATION:
            assert regions in ([], [region])
