"""Steering policies enforced on a real fleet (2 regions x 2 HAProxy nodes, tests/traffic/livekit.py):
what each region's members serve, counted by the members themselves, against the planner's prediction.

ra: 2 members x 20 req/s = 40 req/s; rb: 2 members x 40 req/s = 80 req/s; ingress skewed onto ra1.
The enforcement loop runs in the test's thread once a second (as beat runs it). The 3-region policies
(spray to region's spread by spare capacity) are measured by make bench-steering."""

from __future__ import annotations

import pytest

from apps.balancers.models import Pool, PoolRegion
from apps.events.models import Event
from apps.fleets.node.runtime_api import HAProxySocket
from apps.traffic.overflow import Steering, plan
from apps.traffic.selectors import pool_capacities
from tests.traffic.livekit import NODES, Load, enforce_for, served_between, start

pytestmark = [pytest.mark.django_db, pytest.mark.haproxy]

POLICY_ERROR_MAX = 0.05  # served share per region vs predicted (the goal)


def sampling_slack(share: float, requests: float) -> float:
    """Two standard deviations of a share drawn at random per request (the absorb pass picks a region with
    `rand()`): at 45 req/s for 8 s that is ~0.05 on its own, so the goal is checked for the systematic error
    and the noise is allowed for; make bench-steering measures the goal over enough requests to resolve it.
    At zero systematic error a run fails one time in ~15,000 (|z| > 4); a broken split still fails: waterfall
    would serve 0.11 in rb, a split by member count 0.5."""
    return 2 * (share * (1 - share) / requests) ** 0.5


def predicted_shares(pool: Pool, demand: dict[str, float], steering: Steering) -> dict[str, float]:
    result = plan(demand, pool_capacities(pool), {("ra", "rb"): 20.0}, pool.overflow_policy, steering)  # type: ignore[arg-type]
    total = sum(result.flow(r).served for r in ("ra", "rb"))
    return {r: result.flow(r).served / total for r in ("ra", "rb")}


def measured_shares(rates: dict[str, float]) -> dict[str, float]:
    total = sum(rates.values())
    return {r: v / total for r, v in rates.items()}


def run(fleet, rate: float, seconds: float = 4.0) -> dict[str, float]:
    load = Load(NODES["ra1"][1], fleet.port, rate, duration_s=2.5 + seconds + 1.0)
    enforce_for(2.5)
    rates = served_between(fleet, seconds)
    load.finish()
    return rates


def test_spray_to_world_serves_one_nodes_traffic_in_every_region_by_capacity(
        two_regions, haproxy_node, tiny_backend) -> None:
    """GIVEN all 45 req/s arriving at ra1, and ra with room for 40 of it
    THEN spray to world still sends 2/3 to rb (its share of the capacity); waterfall would keep 40 in ra."""
    Pool.objects.filter(pk=two_regions.pool.pk).update(overflow_policy="spray_to_world")
    fleet = start(two_regions, haproxy_node, tiny_backend)
    pool = Pool.objects.get(pk=fleet.pool.pk)
    want = predicted_shares(pool, {"ra": 45.0}, Steering())
    rates = run(fleet, 45.0, seconds=8.0)
    got = measured_shares(rates)
    assert want["rb"] == pytest.approx(2 / 3)
    slack = sampling_slack(want["rb"], sum(rates.values()) * 8.0)
    assert abs(got["rb"] - want["rb"]) <= POLICY_ERROR_MAX + slack, (got, want, slack)


def test_preferred_region_takes_the_traffic_before_the_origins_own(two_regions, haproxy_node, tiny_backend) -> None:
    Pool.objects.filter(pk=two_regions.pool.pk).update(preferred_regions=["rb"])
    fleet = start(two_regions, haproxy_node, tiny_backend)
    got = measured_shares(run(fleet, 30.0))
    assert got["rb"] >= 1 - POLICY_ERROR_MAX, got  # rb (80 req/s) has room for all of it


def test_traffic_dial_keeps_that_share_in_the_region(two_regions, haproxy_node, tiny_backend) -> None:
    PoolRegion.objects.filter(pool=two_regions.pool, region=two_regions.a).update(traffic_dial=0.5)
    fleet = start(two_regions, haproxy_node, tiny_backend)
    got = measured_shares(run(fleet, 30.0))
    assert abs(got["ra"] - 0.5) <= POLICY_ERROR_MAX, got


def test_region_under_its_failover_threshold_fails_over_by_the_nodes_own_health_and_comes_back(
        two_regions, haproxy_node, tiny_backend) -> None:
    """GIVEN failover at 70% and one of ra's two members taken out on every node (its healthy share 50%)
    THEN ra's traffic is served in rb, one `steering.failed_over` event says so; back in service, ra
    serves its own again after the hold, with one `steering.failed_back` (no flapping in between)."""
    Pool.objects.filter(pk=two_regions.pool.pk).update(failover_threshold=0.7)
    fleet = start(two_regions, haproxy_node, tiny_backend)
    backend = f"p{fleet.pool.pk}_ra"
    for _, conn in fleet.nodes.values():
        HAProxySocket(conn.stats_socket_path).command(f"disable server {backend}/a1")
    got = measured_shares(run(fleet, 20.0))
    assert got["rb"] >= 1 - POLICY_ERROR_MAX, got
    for _, conn in fleet.nodes.values():
        HAProxySocket(conn.stats_socket_path).command(f"enable server {backend}/a1")
    enforce_for(7.0)  # HOLD_S (5 s) at a healthy share, then back
    got = measured_shares(run(fleet, 20.0))
    assert got["ra"] >= 1 - POLICY_ERROR_MAX, got
    events = list(Event.objects.filter(object_id=str(fleet.pool.pk), type__startswith="steering.")
                  .order_by("pk").values_list("type", "data__region"))
    assert events == [("steering.failed_over", "ra"), ("steering.failed_back", "ra")]

