"""Steering policies in the planner: spray to region / world, preferred regions, failover, drain, dials.

Worked examples first (a reader can check them by hand), then properties every policy keeps over random
fleets (the scenarios of test_overflow)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.traffic.overflow import (
    POLICIES,
    SPRAY_TO_REGION,
    SPRAY_TO_WORLD,
    WATERFALL,
    PlanInputError,
    Steering,
    plan,
    region_order,
)
from tests.traffic.traffickit import Scenario, cap, scenarios

DIST = {("a", "b"): 10.0, ("a", "c"): 50.0, ("b", "c"): 40.0}


def served_in(result, region: str) -> float:
    return result.flow(region).served


def test_spray_to_world_splits_by_capacity_whatever_the_ingress() -> None:
    caps = [cap("a", 100), cap("b", 300), cap("c", 100)]
    result = plan({"a": 250.0}, caps, DIST, SPRAY_TO_WORLD)  # all ingress in a, half the total capacity
    assert result.served["a"] == pytest.approx({"a": 50.0, "b": 150.0, "c": 50.0})
    skewed = plan({"a": 50.0, "c": 200.0}, caps, DIST, SPRAY_TO_WORLD)
    assert [served_in(skewed, r) for r in "abc"] == pytest.approx([50.0, 150.0, 50.0])


def test_spray_to_world_past_total_capacity_fills_every_region_and_shares_the_rest() -> None:
    result = plan({"a": 600.0, "b": 200.0}, [cap("a", 100), cap("b", 300)], DIST, SPRAY_TO_WORLD)
    assert served_in(result, "a") == pytest.approx(100.0)
    assert served_in(result, "b") == pytest.approx(300.0)
    assert result.unserved == pytest.approx({"a": 300.0, "b": 100.0})  # in proportion to demand


def test_spray_to_region_serves_locally_then_spreads_the_excess_by_spare_capacity() -> None:
    caps = [cap("a", 100), cap("b", 100), cap("c", 300)]
    result = plan({"a": 250.0, "b": 50.0}, caps, DIST, SPRAY_TO_REGION)
    # a keeps 100; its 150 excess goes over b (50 spare) and c (300 spare) as 1:6, not nearest first.
    assert result.served["a"] == pytest.approx({"a": 100.0, "b": 150 / 7, "c": 900 / 7})
    assert plan({"a": 250.0, "b": 50.0}, caps, DIST, WATERFALL).served["a"] == pytest.approx(
        {"a": 100.0, "b": 50.0, "c": 100.0})


def test_preferred_region_is_used_first_even_over_the_origins_own() -> None:
    caps = [cap("a", 100), cap("b", 100), cap("c", 100)]
    result = plan({"a": 150.0}, caps, DIST, WATERFALL, Steering(preferred=("c",)))
    assert result.served["a"] == pytest.approx({"c": 100.0, "a": 50.0})
    assert region_order("a", "abc", DIST, Steering(preferred=("c", "b"))) == ["c", "b", "a"]


def test_failed_over_region_sends_its_traffic_to_the_nearest_healthy_one_and_serves_last() -> None:
    caps = [cap("a", 100), cap("b", 100), cap("c", 100)]
    steering = Steering(failed_over=frozenset({"a"}))
    assert plan({"a": 80.0}, caps, DIST, WATERFALL, steering).served["a"] == pytest.approx({"b": 80.0})
    full = plan({"a": 250.0}, caps, DIST, WATERFALL, steering)
    assert full.served["a"] == pytest.approx({"b": 100.0, "c": 100.0, "a": 50.0})


def test_drained_region_serves_nothing_under_every_policy() -> None:
    caps = [cap("a", 100), cap("b", 100)]
    for policy in POLICIES:
        result = plan({"a": 50.0, "b": 50.0}, caps, DIST, policy, Steering(drained=frozenset({"a"})))
        assert served_in(result, "a") == 0.0


def test_traffic_dial_keeps_that_share_of_the_regions_own_traffic_and_of_its_capacity() -> None:
    caps = [cap("a", 100), cap("b", 200)]
    result = plan({"a": 80.0}, caps, DIST, WATERFALL, Steering(dials={"a": 0.25}))
    assert result.served["a"] == pytest.approx({"a": 20.0, "b": 60.0})
    inbound = plan({"b": 300.0}, caps, DIST, WATERFALL, Steering(dials={"a": 0.5}))
    assert served_in(inbound, "a") == pytest.approx(50.0)  # half its capacity, for the neighbour too


@pytest.mark.parametrize("steering", [
    {"preferred": ("a", "a")}, {"dials": {"a": 1.5}}, {"dials": {"a": -0.1}}, {"dials": {"a": True}}])
def test_bad_steering_is_refused_with_a_code(steering) -> None:
    with pytest.raises(PlanInputError) as err:
        Steering(**steering)
    assert err.value.code in ("invalid_preferred", "invalid_dial")


steerings = st.builds(
    lambda preferred, failed, drained, dials: Steering(tuple(dict.fromkeys(preferred)), frozenset(failed),
                                                       frozenset(drained), dials),
    st.lists(st.sampled_from("abcde"), max_size=2), st.sets(st.sampled_from("abcde"), max_size=2),
    st.sets(st.sampled_from("abcde"), max_size=1),
    st.dictionaries(st.sampled_from("abcde"), st.sampled_from([0.0, 0.3, 1.0]), max_size=2))


@settings(max_examples=300, deadline=None)
@given(scenarios(), st.sampled_from(POLICIES), steerings)
def test_every_policy_serves_within_capacity_and_accounts_for_all_demand(
        scenario: Scenario, policy, steering: Steering) -> None:
    demand, capacities, distances = scenario
    try:
        result = plan(demand, capacities, distances, policy, steering)
    except PlanInputError:
        return
    effective = steering.effective({c.region: c.capacity for c in capacities})
    for row in result.flows:
        limit = effective.get(row.region, 0.0)
        assert row.served <= limit + 1e-9 * max(1.0, row.served) or math.isinf(limit)
    for origin, rate in demand.items():
        total = sum(result.served[origin].values()) + result.unserved[origin]
        assert total == pytest.approx(rate, rel=1e-9, abs=1e-9)
        if policy == SPRAY_TO_WORLD:
            continue  # no region is an origin's own under spray to world: its dial bounds capacity only
        dial = steering.dial(origin)
        assert result.served[origin].get(origin, 0.0) <= rate * dial + 1e-9 * max(1.0, rate)
