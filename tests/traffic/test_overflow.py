"""Overflow planner: example plans a reader can check by hand, then properties over random fleets."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.traffic.overflow import (
    ISOLATION,
    WATERFALL,
    Plan,
    PlanInputError,
    Policy,
    RegionCapacity,
    plan,
    region_order,
)
from tests.traffic.traffickit import Scenario, cap, scenarios

# --- capacity ---------------------------------------------------------------------------


def test_capacity_is_healthy_members_times_rate_times_scaler() -> None:
    assert RegionCapacity("a", 4, 25.0, 0.5).capacity == 50.0


def test_unlimited_rate_is_infinite_capacity_while_a_member_is_healthy() -> None:
    assert RegionCapacity("a", 2, None, 1.0).capacity == math.inf
    assert RegionCapacity("a", 0, None, 1.0).capacity == 0.0


def test_drained_region_has_no_capacity() -> None:
    assert RegionCapacity("a", 10, 100.0, 0.0).capacity == 0.0
    assert RegionCapacity("a", 10, None, 0.0).capacity == 0.0


@pytest.mark.parametrize("scaler", [0.05, 1.5, -0.1, math.nan])
def test_capacity_scaler_outside_gcp_range_is_refused(scaler: float) -> None:
    with pytest.raises(PlanInputError) as err:
        RegionCapacity("a", 1, 10.0, scaler)
    assert err.value.code == "invalid_capacity"


def test_negative_member_count_or_rate_is_refused() -> None:
    with pytest.raises(PlanInputError):
        RegionCapacity("a", -1, 10.0, 1.0)
    with pytest.raises(PlanInputError):
        RegionCapacity("a", 1, -10.0, 1.0)


# --- region order -----------------------------------------------------------------------


def test_region_order_is_origin_then_nearest_first() -> None:
    distances = {("a", "b"): 30.0, ("a", "c"): 10.0, ("a", "d"): 20.0}
    assert region_order("a", ["d", "b", "c", "a"], distances) == ["a", "c", "d", "b"]


def test_region_order_breaks_ties_by_name_and_puts_unknown_distances_last() -> None:
    distances = {("a", "z"): 10.0, ("a", "m"): 10.0}
    assert region_order("a", ["x", "z", "m", "b", "a"], distances) == ["a", "m", "z", "b", "x"]


def test_a_distance_stored_in_one_direction_counts_both_ways() -> None:
    distances = {("b", "a"): 5.0, ("a", "c"): 10.0}
    assert region_order("a", ["c", "b"], distances) == ["b", "c"]


def test_negative_rtt_is_refused() -> None:
    with pytest.raises(PlanInputError) as err:
        region_order("a", ["a", "b"], {("a", "b"): -1.0})
    assert err.value.code == "invalid_distance"


# --- example plans ----------------------------------------------------------------------


def test_excess_over_local_capacity_goes_to_the_next_region() -> None:
    """A: capacity 10, demand 25; B: capacity 30 -> A serves 10 locally and sends 15 to B."""
    result = plan({"a": 25.0}, [cap("a", 10), cap("b", 30)], {("a", "b"): 20.0})

    assert result.served == {"a": {"a": 10.0, "b": 15.0}}
    assert result.unserved == {"a": 0.0}
    a, b = result.flow("a"), result.flow("b")
    assert (a.capacity, a.demand, a.local, a.out, a.in_) == (10.0, 25.0, 10.0, 15.0, 0.0)
    assert a.out_to == {"b": 15.0}
    assert a.utilization == 1.0
    assert (b.capacity, b.demand, b.local, b.out, b.in_) == (30.0, 0.0, 0.0, 0.0, 15.0)
    assert b.in_from == {"a": 15.0}
    assert b.utilization == 0.5
    assert b.spare == 15.0


def test_demand_under_capacity_stays_local() -> None:
    result = plan({"a": 8.0, "b": 30.0}, [cap("a", 10), cap("b", 30)], {("a", "b"): 20.0})
    assert result.served == {"a": {"a": 8.0}, "b": {"b": 30.0}}
    assert result.total_unserved == 0.0


def test_overflow_fills_the_nearest_region_then_the_next() -> None:
    """A: cap 10, demand 50; B (10 ms): cap 20; C (50 ms): cap 100 -> 10 + 20 + 20."""
    distances = {("a", "b"): 10.0, ("a", "c"): 50.0, ("b", "c"): 40.0}
    result = plan({"a": 50.0}, [cap("a", 10), cap("b", 20), cap("c", 100)], distances)
    assert result.served["a"] == {"a": 10.0, "b": 20.0, "c": 20.0}
    assert result.flow("c").utilization == 0.2


def test_a_region_busy_with_its_own_traffic_takes_only_its_spare_capacity() -> None:
    """B serves its own 15 first; only 5 of its 20 are left for A's overflow."""
    distances = {("a", "b"): 10.0, ("a", "c"): 50.0}
    result = plan({"a": 30.0, "b": 15.0}, [cap("a", 10), cap("b", 20), cap("c", 100)], distances)
    assert result.served["a"] == {"a": 10.0, "b": 5.0, "c": 15.0}
    assert result.served["b"] == {"b": 15.0}


def test_over_capacity_everywhere_is_unserved() -> None:
    result = plan({"a": 100.0}, [cap("a", 10), cap("b", 30)], {("a", "b"): 20.0})
    assert result.served["a"] == {"a": 10.0, "b": 30.0}
    assert result.unserved["a"] == 60.0
    assert result.flow("a").unserved == 60.0


def test_nearer_origin_gets_a_contested_region_first() -> None:
    """A and C both overflow 10 into B (spare 10); A is 5 ms from B, C is 20 ms: A wins, C goes on to D."""
    distances = {("a", "b"): 5.0, ("c", "b"): 20.0, ("a", "d"): 90.0, ("c", "d"): 30.0}
    capacities = [cap("a", 0), cap("b", 10), cap("c", 0), cap("d", 100)]
    result = plan({"a": 10.0, "c": 10.0}, capacities, distances)
    assert result.served["a"] == {"b": 10.0}
    assert result.served["c"] == {"d": 10.0}


def test_origins_at_equal_distance_split_an_oversubscribed_region_in_proportion() -> None:
    """A sends 30 and C sends 10 to B (spare 20), both 10 ms away: B gives 15 and 5."""
    distances = {("a", "b"): 10.0, ("c", "b"): 10.0, ("a", "d"): 50.0, ("c", "d"): 50.0}
    capacities = [cap("a", 0), cap("b", 20), cap("c", 0), cap("d", 100)]
    result = plan({"a": 30.0, "c": 10.0}, capacities, distances)
    assert result.served["a"] == pytest.approx({"b": 15.0, "d": 15.0})
    assert result.served["c"] == pytest.approx({"b": 5.0, "d": 5.0})


def test_drained_region_serves_nothing_and_its_demand_spills() -> None:
    capacities = [RegionCapacity("a", 4, 10.0, 0.0), cap("b", 100)]
    result = plan({"a": 20.0, "b": 5.0}, capacities, {("a", "b"): 10.0})
    assert result.served["a"] == {"b": 20.0}
    assert result.flow("a").local == 0.0
    assert result.flow("a").utilization == 0.0


def test_region_without_healthy_members_serves_nothing() -> None:
    capacities = [RegionCapacity("a", 0, 10.0, 1.0), cap("b", 100)]
    result = plan({"a": 20.0}, capacities, {("a", "b"): 10.0})
    assert result.served["a"] == {"b": 20.0}


def test_demand_from_a_region_without_the_pool_goes_to_the_nearest_pool_region() -> None:
    distances = {("edge", "b"): 10.0, ("edge", "c"): 5.0}
    result = plan({"edge": 20.0}, [cap("b", 100), cap("c", 100)], distances)
    assert result.served["edge"] == {"c": 20.0}
    assert result.flow("edge").capacity == 0.0


def test_region_with_unknown_distance_is_used_last() -> None:
    result = plan({"a": 30.0}, [cap("a", 10), cap("b", 10), cap("z", 100)], {("a", "z"): 200.0})
    assert result.served["a"] == {"a": 10.0, "z": 20.0}
    result = plan({"a": 300.0}, [cap("a", 10), cap("b", 10), cap("z", 100)], {("a", "z"): 200.0})
    assert result.served["a"] == {"a": 10.0, "z": 100.0, "b": 10.0}


def test_unlimited_region_takes_all_overflow() -> None:
    result = plan({"a": 1e6}, [cap("a", 10), cap("b", None)], {("a", "b"): 10.0})
    assert result.served["a"] == {"a": 10.0, "b": 1e6 - 10.0}
    assert result.flow("b").utilization == 0.0


def test_isolation_serves_only_locally() -> None:
    result = plan({"a": 25.0}, [cap("a", 10), cap("b", 30)], {("a", "b"): 20.0}, ISOLATION)
    assert result.served == {"a": {"a": 10.0}}
    assert result.unserved == {"a": 15.0}


@pytest.mark.parametrize("rate", [-1.0, math.inf, math.nan])
def test_invalid_demand_is_refused(rate: float) -> None:
    with pytest.raises(PlanInputError) as err:
        plan({"a": rate}, [cap("a", 10)], {})
    assert err.value.code == "invalid_demand"


def test_unknown_policy_and_duplicate_regions_are_refused() -> None:
    with pytest.raises(PlanInputError) as err:
        plan({"a": 1.0}, [cap("a", 10)], {}, "spray")  # type: ignore[arg-type]
    assert err.value.code == "invalid_policy"
    with pytest.raises(PlanInputError) as err:
        plan({"a": 1.0}, [cap("a", 10), cap("a", 20)], {})
    assert err.value.code == "duplicate_region"


# --- properties -------------------------------------------------------------------------

def _tolerance(value: float) -> float:
    return 1e-9 * max(1.0, value)


def _spare(result: Plan) -> dict[str, float]:
    return {row.region: row.capacity - row.served for row in result.flows}


@settings(max_examples=400, deadline=None)
@given(scenarios(), st.sampled_from([WATERFALL, ISOLATION]))
def test_every_request_is_served_somewhere_or_counted_unserved(scenario: Scenario, policy: Policy) -> None:
    demand, capacities, distances = scenario
    result = plan(demand, capacities, distances, policy)
    for origin, rate in demand.items():
        accounted = sum(result.served[origin].values()) + result.unserved[origin]
        assert accounted == pytest.approx(rate, rel=1e-6, abs=1e-9)
        assert result.unserved[origin] >= 0


@settings(max_examples=400, deadline=None)
@given(scenarios(), st.sampled_from([WATERFALL, ISOLATION]))
def test_no_region_serves_above_its_capacity(scenario: Scenario, policy: Policy) -> None:
    demand, capacities, distances = scenario
    result = plan(demand, capacities, distances, policy)
    for row in result.flows:
        into_region = sum(by_region.get(row.region, 0.0) for by_region in result.served.values())
        assert into_region == pytest.approx(row.served)
        assert into_region <= row.capacity + _tolerance(row.capacity)


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_waterfall_leaves_nothing_unserved_while_any_region_has_room(scenario: Scenario) -> None:
    demand, capacities, distances = scenario
    result = plan(demand, capacities, distances)
    if result.total_unserved > _tolerance(sum(demand.values())):
        for region, room in _spare(result).items():
            assert room <= _tolerance(result.flow(region).capacity), region


@settings(max_examples=400, deadline=None)
@given(scenarios())
def test_an_origin_never_skips_a_nearer_region_with_room(scenario: Scenario) -> None:
    demand, capacities, distances = scenario
    result = plan(demand, capacities, distances)
    spare = _spare(result)
    pool_regions = [c.region for c in capacities]
    for origin, by_region in result.served.items():
        order = region_order(origin, pool_regions, distances)
        used = [region for region in by_region if region != origin]
        for region in used:
            for nearer in order[: order.index(region)]:
                assert spare[nearer] <= _tolerance(result.flow(nearer).capacity), (origin, region, nearer)


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from([WATERFALL, ISOLATION]))
def test_region_without_capacity_serves_nothing(scenario: Scenario, policy: Policy) -> None:
    demand, capacities, distances = scenario
    result = plan(demand, capacities, distances, policy)
    dead = {c.region for c in capacities if c.healthy_members == 0 or c.capacity_scaler == 0}
    for by_region in result.served.values():
        assert not dead & set(by_region)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_isolation_keeps_everything_local(scenario: Scenario) -> None:
    demand, capacities, distances = scenario
    result = plan(demand, capacities, distances, ISOLATION)
    local_capacity = {c.region: c.capacity for c in capacities}
    for origin, rate in demand.items():
        assert set(result.served[origin]) <= {origin}
        assert result.served[origin].get(origin, 0.0) == min(rate, local_capacity.get(origin, 0.0))
        assert result.flow(origin).out == 0.0


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_plan_does_not_depend_on_input_order(scenario: Scenario) -> None:
    demand, capacities, distances = scenario
    first = plan(demand, capacities, distances)
    again = plan(
        dict(reversed(demand.items())), list(reversed(capacities)), dict(reversed(distances.items()))
    )
    assert first == again
