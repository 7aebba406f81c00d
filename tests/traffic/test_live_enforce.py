"""Per-node shares set at run time (apps.fleets.enforcement) on a real fleet: 2 regions x 2 HAProxy nodes.

Configs come from the production path (fleet_snapshot -> render); the enforcement loop runs in the
test's thread (it reads the test's database rows) once a second, as the Celery beat runs it; the
load is open-loop (apps.capacity.engine) into chosen nodes. What happened is read from the members'
own counters (TinyBackend.hits).

ra: 2 members x 20 req/s = 40 req/s; rb: 2 members x 40 req/s = 80 req/s; 20 ms apart.
"""

from __future__ import annotations

import socket
from collections import Counter

import pytest

from apps.balancers.models import Listener
from apps.fleets.enforcement import enforce
from apps.fleets.models import Fleet, Node
from tests.traffic.livekit import A_CAPACITY, B_CAPACITY, NODES, Load, enforce_for, served_between, start

pytestmark = [pytest.mark.django_db, pytest.mark.haproxy]

def test_all_ingress_through_one_node_is_served_locally_up_to_the_region_capacity(
    two_regions, haproxy_node, tiny_backend
) -> None:
    """GIVEN 2 nodes per region and 60 req/s arriving only at ra1 (1.5x ra's 40 req/s)
    THEN ra's members serve ~40 req/s (not 40/4 as a static per-sender division would), rb's the rest;
    the limits on the nodes with demand (ra1 only) never sum above a region's capacity, and each idle
    node keeps its static share of its own region (so ingress moving onto it is served there at once)."""
    fleet = start(two_regions, haproxy_node, tiny_backend)
    pool_id = fleet.pool.pk
    load = Load(NODES["ra1"][1], fleet.port, 60.0, duration_s=8.0)
    enforce_for(2.5)  # warm-up: the loop sees ra1's demand and gives it ra's capacity
    rates = served_between(fleet, 4.0)
    load.finish()
    assert rates["ra"] >= 0.9 * A_CAPACITY, rates
    assert rates["ra"] <= 1.05 * A_CAPACITY, rates
    assert rates["rb"] == pytest.approx(60.0 - A_CAPACITY, abs=8.0), rates
    ra1 = fleet.limits("ra1")
    assert 0.9 * A_CAPACITY <= ra1[f"p{pool_id}_ra"] <= A_CAPACITY, ra1
    assert ra1[f"p{pool_id}_rb"] <= B_CAPACITY, ra1
    assert fleet.limits("ra2")[f"p{pool_id}_ra"] == A_CAPACITY // 2
    assert [fleet.limits(n)[f"p{pool_id}_rb"] for n in ("rb1", "rb2")] == [B_CAPACITY // 2] * 2


def test_stale_observations_fall_back_to_the_static_floor_share(two_regions, haproxy_node, tiny_backend) -> None:
    """GIVEN the loop gave ra1 most of ra's capacity
    WHEN ra2 stops answering (its observations are missing)
    THEN every reachable node gets the static share: ra's capacity / ra's 2 nodes, 0 of another
    region's capacity (that region's own nodes hold it), and never more than the capacity in sum."""
    fleet = start(two_regions, haproxy_node, tiny_backend)
    pool_id = fleet.pool.pk
    load = Load(NODES["ra1"][1], fleet.port, 50.0, duration_s=3.0)
    enforce_for(2.5)
    assert fleet.limits("ra1")[f"p{pool_id}_ra"] > A_CAPACITY / 2
    load.finish()
    Node.objects.filter(name="ra2").update(runtime_dir="/nonexistent/spillway-i13")
    run = enforce()
    assert run["pools"] == {pool_id: "static"} and len(run["unreachable"]) == 1
    assert fleet.limits("ra1")[f"p{pool_id}_ra"] == A_CAPACITY // 2
    assert fleet.limits("ra1")[f"p{pool_id}_rb"] == 0
    assert fleet.limits("rb1")[f"p{pool_id}_rb"] == B_CAPACITY // 2


def first_refusal(address: str, port: int) -> str:
    """The head of the first refused answer in a burst of 120 requests on one connection ("" if none was).

    Sent while the load still arrives at twice the capacity: after it ends the regions' 1 s rates fall back under
    their limits, and on a busy machine a burst of sequential requests alone may not climb past them again."""
    with socket.create_connection((address, port), timeout=2) as raw:
        for _ in range(120):
            raw.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            head = raw.recv(4096).decode()
            if head.startswith("HTTP/1.1 503"):
                return head
    return ""


@pytest.mark.parametrize("overload", ["shed", "absorb"])
def test_every_region_full(two_regions, haproxy_node, tiny_backend, overload: str) -> None:
    """GIVEN 240 req/s, twice the pool's 120 req/s, arriving 80/20 at ra1 and rb1
    THEN `shed` serves about the capacity and answers the rest 503 with Retry-After, and `absorb`
    serves everything, spread over the regions in proportion to their capacities (1:2)."""
    fleet = start(two_regions, haproxy_node, tiny_backend, overload=overload)
    loads = [Load(NODES["ra1"][1], fleet.port, 192.0, duration_s=7.0),
             Load(NODES["rb1"][1], fleet.port, 48.0, duration_s=7.0)]
    enforce_for(2.0)
    rates = served_between(fleet, 3.5)
    refused = first_refusal(NODES["ra1"][1], fleet.port) if overload == "shed" else ""
    results = [load.finish() for load in loads]
    errors: Counter[str] = Counter()
    for result in results:
        for step in result.steps:
            errors.update({k: v for k, v in step.errors.items() if v})
    total = rates["ra"] + rates["rb"]
    if overload == "shed":
        assert total == pytest.approx(A_CAPACITY + B_CAPACITY, rel=0.12), rates
        assert rates["ra"] <= 1.08 * A_CAPACITY and rates["rb"] <= 1.08 * B_CAPACITY, rates
        assert set(errors) == {"non_2xx"} and errors["non_2xx"] > 0, errors
        assert refused.startswith("HTTP/1.1 503"), "no 503 in a burst of 120 requests past the capacity"
        assert "retry-after: 1" in refused.lower()
    else:
        assert not errors, errors
        assert total == pytest.approx(240.0, rel=0.12), rates
        assert rates["rb"] / rates["ra"] == pytest.approx(B_CAPACITY / A_CAPACITY, rel=0.2), rates


def test_a_capacity_test_holds_off_overflow_of_the_region_it_measures(two_regions) -> None:
    """While a capacity test measures ra (overflow_hold), ra's nodes serve ra unlimited and send nothing
    on, so the knee is ra's own; released, the shares follow demand again."""
    from django.core.cache import cache

    from apps.fleets.enforcement import NodeReading, desired_limits, lb_nodes, overflow_hold, overflow_release

    pool = two_regions.pool
    for slug, region in (("ra", two_regions.a), ("rb", two_regions.b)):
        fleet = Fleet.objects.create(name=f"f{slug}", region=region)
        fleet.serves.add(two_regions.lb)
        for i in (1, 2):
            Node.objects.create(fleet=fleet, name=f"{slug}{i}", address="127.0.0.1", runtime_dir=f"/tmp/x{slug}{i}",
                                config_dir=f"/tmp/x{slug}{i}/etc")
    lbs = lb_nodes()
    ids = {n.name: n.pk for n, _ in lbs[two_regions.lb.pk].values()}
    readings = {nid: NodeReading(nid, name[:2], True, demand={pool.pk: 50.0 if name == "ra1" else 0.0})
                for name, nid in ids.items()}
    ra, rb = f"p{pool.pk}_ra", f"p{pool.pk}_rb"
    wanted = desired_limits(readings, lbs).limits
    assert wanted[ids["ra1"]][ra] == 20 and wanted[ids["ra1"]][rb] > 0  # ra (2 x 10) full, 30 overflow
    overflow_hold(pool.pk, "ra", 30)
    try:
        desired = desired_limits(readings, lbs)
        wanted = desired.limits
        assert desired.modes[pool.pk] == "held dynamic"
        assert wanted[ids["ra1"]][ra] == wanted[ids["ra2"]][ra] == 1_000_000_000
        assert wanted[ids["ra1"]][rb] == 0 and wanted[ids["rb1"]][ra] == 0
    finally:
        overflow_release(pool.pk)
    assert cache.get(f"spillway:overflow-hold:{pool.pk}") is None
    assert desired_limits(readings, lbs).limits[ids["ra1"]][ra] == 20


def test_starting_a_capacity_run_sets_the_held_limits_on_the_nodes_before_its_shards_start(
    two_regions, haproxy_node, tiny_backend
) -> None:
    """GIVEN ra1 had most of ra's capacity and no enforcement loop runs (the shards can take every
    worker slot, so the beat's enforce_task expires unrun) WHEN a capacity run of the pool in ra starts
    THEN ra's nodes already serve ra unlimited and send nothing on, and rb's nodes send nothing to ra:
    the knee measured is ra's own."""
    from apps.capacity.execution import run_prepare
    from apps.capacity.models import CapacityRun, CapacityTest, TargetAllowlist
    from apps.fleets.config.render.chain import UNLIMITED
    from apps.fleets.enforcement import overflow_release

    fleet = start(two_regions, haproxy_node, tiny_backend)
    pool_id = fleet.pool.pk
    ra, rb = f"p{pool_id}_ra", f"p{pool_id}_rb"
    load = Load(NODES["ra1"][1], fleet.port, 60.0, duration_s=3.0)
    enforce_for(2.5)
    load.finish()
    assert fleet.limits("ra1")[ra] < UNLIMITED and fleet.limits("ra1")[rb] > 0
    TargetAllowlist.objects.create(cidr="127.0.0.0/8", org=None)  # the nodes listen on loopback
    test = CapacityTest.objects.create(
        org=two_regions.lb.org, name="knee-ra", listener=Listener.objects.get(lb=two_regions.lb), pool=fleet.pool,
        region=two_regions.a, steps=[[10.0, 1.0]], shards=1, max_connections=10)
    run = CapacityRun.objects.create(test=test, shards_total=1, step_count=1, peak_rate=10.0, concurrency=10)
    try:
        # The shards are enqueued on commit (never, inside this test's transaction): none runs here.
        assert run_prepare(run.pk, lambda run_id, index, limit_s: None) == "started"
        for name in ("ra1", "ra2"):
            assert fleet.limits(name)[ra] == UNLIMITED and fleet.limits(name)[rb] == 0, name
        for name in ("rb1", "rb2"):
            assert fleet.limits(name)[ra] == 0, name
    finally:
        overflow_release(pool_id)
