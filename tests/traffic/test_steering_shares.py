"""Steering enforced by per-node limits and overload weights: what the chains serve equals the plan.

`enforced_plan` walks each node's chain the way the rendered HAProxy rules do (limits first, the
overload pass past them), so these compare the enforcement's arithmetic with the planner's promise
under skewed ingress; tests/traffic/test_live_steering.py measures the same on real nodes."""

from __future__ import annotations

import pytest

from apps.traffic.observe import enforced_plan
from apps.traffic.overflow import POLICIES, SPRAY_TO_REGION, SPRAY_TO_WORLD, WATERFALL, Steering, plan
from apps.traffic.shares import absorb_weights, planned_limits, reserve_idle
from tests.traffic.traffickit import cap

CAPS = [cap("a", 120, healthy=3), cap("b", 240, healthy=3), cap("c", 120, healthy=3)]
DIST = {("a", "b"): 10.0, ("a", "c"): 50.0, ("b", "c"): 40.0}
NODES = {"a1": "a", "a2": "a", "b1": "b", "b2": "b", "c1": "c"}
SKEWS = {
    "one node": {"a1": 300.0},
    "80/20": {"a1": 120.0, "a2": 120.0, "b1": 30.0, "b2": 30.0},
    "uniform": dict.fromkeys(NODES, 60.0),
}
STEERINGS = {
    "none": Steering(),
    "preferred c": Steering(preferred=("c",)),
    "a failed over": Steering(failed_over=frozenset({"a"})),
    "b drained": Steering(drained=frozenset({"b"})),
    "a dial 50%": Steering(dials={"a": 0.5}),
}


def enforced(policy, steering: Steering, demand: dict[str, float], overload: str = "absorb"):
    limits, result = planned_limits(CAPS, NODES, demand, DIST, policy, steering, overload)
    limits = reserve_idle(limits, CAPS, NODES, demand, policy, steering)
    raw = {c.region: c.capacity for c in CAPS}
    weights = absorb_weights(policy, CAPS, NODES, DIST, result, steering)
    node_demand = {n: (r, demand.get(n, 0.0)) for n, r in NODES.items()}
    return enforced_plan(node_demand, {n: list(row.items()) for n, row in limits.items()},
                         steering.effective(raw), policy, overload, weights)


@pytest.mark.parametrize("overload", ["absorb", "shed"])
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("skew", SKEWS)
@pytest.mark.parametrize("steer", STEERINGS)
def test_what_the_chains_serve_per_region_is_the_plan(policy, skew, steer, overload) -> None:
    demand = SKEWS[skew]
    steering = STEERINGS[steer]
    region_demand: dict[str, float] = {}
    for node, rate in demand.items():
        region_demand[NODES[node]] = region_demand.get(NODES[node], 0.0) + rate
    promised = plan(region_demand, CAPS, DIST, policy, steering)
    if overload == "absorb" and promised.total_unserved > 0:
        pytest.skip("past capacity, absorb overloads what the plan counts unserved (test_overflow's)")
    got = enforced(policy, steering, demand, overload)
    total = sum(demand.values())
    for region in "abc":
        want = promised.flow(region).served
        # Limits are whole req/s per node: flooring costs at most one per node.
        assert got.flow(region).served == pytest.approx(want, abs=len(NODES) + 0.01 * total), region


def test_spray_to_world_puts_one_nodes_traffic_everywhere_by_capacity() -> None:
    got = enforced(SPRAY_TO_WORLD, Steering(), {"a1": 240.0})
    assert [got.flow(r).served for r in "abc"] == pytest.approx([60.0, 120.0, 60.0], abs=5)
    waterfall = enforced(WATERFALL, Steering(), {"a1": 240.0})
    assert waterfall.flow("a").served == pytest.approx(120.0, abs=5)


def test_spray_to_region_weights_the_overflow_by_spare_capacity_not_distance() -> None:
    weights = absorb_weights(SPRAY_TO_REGION, CAPS, NODES, DIST, plan({"a": 300.0}, CAPS, DIST, SPRAY_TO_REGION))
    assert weights["a1"]["a"] == 0.0  # its own region is full when traffic gets to the overload pass
    assert weights["a1"]["b"] == pytest.approx(2 * weights["a1"]["c"])  # 240 vs 120 spare
