"""Observation maths (pure, no database): backend names, counter rates, flows, enforced prediction."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.traffic.observe import (
    BackendReading,
    BackendRef,
    NodePoolSample,
    counter_rate,
    enforced_plan,
    mean_by_node,
    node_samples,
    observed_flows,
    parse_backend,
    plan_to_dict,
    split_demand,
)
from apps.traffic.overflow import RegionCapacity, plan
from apps.traffic.shares import static_steps


def test_backend_names_parse_into_pool_region_and_protocol() -> None:
    assert parse_backend("p12_eu-west") == BackendRef(12, "eu-west", "http")
    assert parse_backend("p3_us_tcp") == BackendRef(3, "us", "tcp")
    for foreign in ("stats", "p_eu", "px_eu", "p1_", "fe_edge.web"):
        assert parse_backend(foreign) is None


def test_counter_rate_covers_the_whole_interval_and_refuses_resets_and_long_gaps() -> None:
    assert counter_rate(100, 10.0, 150, 15.0) == 10.0
    assert counter_rate(100, 10.0, 20, 15.0) is None  # reloaded worker: counters restart
    assert counter_rate(100, 10.0, 150, 200.0) is None  # too long ago
    assert counter_rate(None, None, 150, 15.0) is None


def test_node_samples_split_a_node_s_traffic_by_destination_region() -> None:
    readings = [
        BackendReading("p1_a", rate_per_s=12, sessions=2, requests_total=1000),
        BackendReading("p1_b", rate_per_s=7, sessions=1, requests_total=500),
        BackendReading("p1_b_tcp", rate_per_s=1, sessions=0),
        BackendReading("p2_a", rate_per_s=3),
        BackendReading("stats", rate_per_s=99),
    ]
    first = node_samples(node="fa/n1", region="a", readings=readings, at_s=100.0)
    assert [s.pool_id for s in first] == [1, 2]
    assert first[0].sent == {"a": 12.0, "b": 8.0} and first[0].local == 12.0 and first[0].sent_to == {"b": 8.0}
    assert first[0].demand == 20.0 and first[0].sessions == 3
    # Five seconds later the counters say 10/s and 4/s on average, whatever the last second showed.
    later = [
        BackendReading("p1_a", rate_per_s=30, requests_total=1050),
        BackendReading("p1_b", rate_per_s=0, requests_total=520),
    ]
    second = node_samples(node="fa/n1", region="a", readings=later, at_s=105.0,
                          previous={1: (100.0, first[0].totals)})
    assert second[0].sent == {"a": 10.0, "b": 4.0}


def test_observed_flows_add_up_per_region_with_in_and_out() -> None:
    samples = [
        NodePoolSample(1, "fa/n1", "a", sent={"a": 10.0, "b": 6.0}),
        NodePoolSample(1, "fa/n2", "a", sent={"a": 10.0, "b": 4.0}),
        NodePoolSample(1, "fb/n1", "b", sent={"b": 5.0}),
    ]
    flows = {f.region: f for f in observed_flows(samples, {"a": 20.0, "b": 40.0})}
    a, b = flows["a"], flows["b"]
    assert (a.demand, a.local, a.out, a.in_, a.out_to) == (30.0, 20.0, 10.0, 0.0, {"b": 10.0})
    assert (b.demand, b.local, b.out, b.in_, b.in_from) == (5.0, 5.0, 0.0, 10.0, {"a": 10.0})
    assert a.utilization == 1.0 and b.utilization == pytest.approx(15 / 40)


def test_mean_by_node_averages_each_node_then_regions_add_nodes() -> None:
    samples = [
        NodePoolSample(1, "n1", "a", sent={"a": 10.0}),
        NodePoolSample(1, "n1", "a", sent={"a": 20.0, "b": 4.0}),
        NodePoolSample(1, "n2", "a", sent={"a": 6.0}),
    ]
    merged = {s.node: s for s in mean_by_node(samples)}
    assert merged["n1"].sent == {"a": 15.0, "b": 2.0}
    assert merged["n2"].sent == {"a": 6.0}


CAPS = [RegionCapacity("a", 2, 10.0), RegionCapacity("b", 4, 10.0)]
DIST = {("a", "b"): 20.0}


def test_one_entry_node_serves_its_region_up_to_capacity_exactly_like_the_plan() -> None:
    chain = [("a", 20), ("b", None)]  # the region's whole capacity, then the rest to b
    enforced = enforced_plan({"n1": ("a", 50.0)}, {"n1": chain}, {"a": 20.0, "b": 40.0}, "waterfall")
    ideal = plan({"a": 50.0}, CAPS, DIST)
    assert enforced.served == ideal.served == {"a": {"a": 20.0, "b": 30.0}}


def test_a_share_split_among_every_sender_overflows_earlier_than_the_global_plan() -> None:
    # One node per region, each allowed half of A's capacity whether the other is idle or not (the even split
    # apps.traffic.shares replaced: its static rule gives a region to its own nodes).
    chains = {"na": [("a", 10), ("b", None)], "nb": [("b", 20), ("a", None)]}
    enforced = enforced_plan({"na": ("a", 30.0), "nb": ("b", 0.0)}, chains, {"a": 20.0, "b": 40.0}, "waterfall")
    assert enforced.served["a"] == {"a": 10.0, "b": 20.0}
    assert plan({"a": 30.0}, CAPS, DIST).served["a"] == {"a": 20.0, "b": 10.0}


def test_isolation_keeps_everything_in_its_region_and_a_node_without_chain_serves_nothing() -> None:
    chain = static_steps(CAPS, "a", DIST, "isolation", {"a": 1, "b": 1})
    assert chain == [("a", 20)]
    enforced = enforced_plan({"na": ("a", 50.0), "nc": ("c", 5.0)}, {"na": chain}, {"a": 20.0}, "isolation")
    assert enforced.served["a"] == {"a": 50.0}  # absorbed, overloaded: HAProxy has nowhere else to go
    assert enforced.unserved == {"a": 0.0, "c": 5.0}


def test_past_a_chain_of_only_limited_steps_absorb_spreads_by_capacity_and_shed_refuses() -> None:
    args = ({"n": ("a", 50.0)}, {"n": [("a", 10), ("b", 15)]}, {"a": 10.0, "b": 15.0}, "waterfall")
    assert enforced_plan(*args).served["a"] == {"a": 10.0 + 25.0 * 0.4, "b": 15.0 + 25.0 * 0.6}
    shed = enforced_plan(*args, "shed")
    assert shed.served["a"] == {"a": 10.0, "b": 15.0} and shed.unserved["a"] == 25.0


def test_the_overload_pass_spreads_what_arrives_and_no_more_whatever_the_capacities() -> None:
    """A chain whose only step is full (limit 0) spreads what arrives over its steps by capacity: with a capacity
    of 5e-324 req/s, `left * weight` underflowed and 1.5 req/s arriving came out as 2.0 served (found by the
    property below once it took the product's static chains)."""
    result = enforced_plan({"n": ("b", 1.5)}, {"n": [("a", 0)]}, {"a": 5e-324, "b": 0.0}, "waterfall")
    assert result.served["b"] == {"a": 1.5}


def test_split_demand_spreads_a_region_over_its_nodes_and_skips_regions_without_nodes() -> None:
    assert split_demand({"a": 30.0, "c": 5.0}, {"a": ["n1", "n2", "n3"]}) == {
        "n1": ("a", 10.0), "n2": ("a", 10.0), "n3": ("a", 10.0)}


def test_plan_json_has_no_infinity() -> None:
    data = plan_to_dict(plan({"a": 5.0}, [RegionCapacity("a", 1, None)], {}))
    assert data["regions"][0]["capacity"] is None
    assert data["regions"][0]["local"] == 5.0


@settings(max_examples=200, deadline=None)
@given(
    demand=st.lists(st.floats(0, 1000, allow_nan=False), min_size=2, max_size=4),
    rates=st.lists(st.one_of(st.none(), st.floats(0, 100, allow_nan=False)), min_size=2, max_size=4),
    members=st.lists(st.integers(0, 5), min_size=2, max_size=4),
    policy=st.sampled_from(["waterfall", "isolation"]),
)
def test_enforcement_creates_and_loses_nothing(demand, rates, members, policy) -> None:
    regions = [f"r{i}" for i in range(min(len(demand), len(rates), len(members)))]
    caps = [RegionCapacity(r, members[i], rates[i]) for i, r in enumerate(regions)]
    dist = {(a, b): float(abs(i - j)) for i, a in enumerate(regions) for j, b in enumerate(regions) if a < b}
    nodes = dict.fromkeys(regions, 1)
    chains = {f"n-{r}": static_steps(caps, r, dist, policy, nodes) for r in regions}
    result = enforced_plan({f"n-{r}": (r, demand[i]) for i, r in enumerate(regions)}, chains,
                           {c.region: c.capacity for c in caps}, policy)
    for i, r in enumerate(regions):
        served = sum(result.served.get(r, {}).values())
        assert math.isclose(served + result.unserved[r], demand[i], rel_tol=1e-9, abs_tol=1e-9)
        if policy == "isolation":
            assert set(result.served.get(r, {})) <= {r}
