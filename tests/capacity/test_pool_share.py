"""A capacity run's recommendation counts only what the pool's own members served.

GIVEN a route that sends half its requests to the tested pool and half to a canary pool, on a real local fleet,
WHEN a capacity test of the pool runs through a real worker, THEN the run records how many requests the
pool's members served (read from the nodes' own counters), about half of those sent, and the recommendation
is made from that half, not from everything the test sent (the demo's `shop-knee` recommended 12.8x the
current capacity that way).
"""

from __future__ import annotations

import warnings

import pytest

from apps.balancers.models import RouteTarget
from apps.capacity.knee import FIRST_STEP_FAILED
from apps.capacity.models import CapacityRun, CapacityTest, TargetAllowlist
from apps.capacity.services import capacity_run_start
from tests.capacity.capacitykit import answered_all, wait_for_run
from tests.fleets.fleetkit import add_pool, add_route, make_local_fleet, reconcile

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db(transaction=True)]


def _missed_with_nothing_lost(run: CapacityRun) -> bool:
    """The run failed at its lowest step (p99 or late answers) while every request it sent there got a 2xx."""
    if run.status != CapacityRun.Status.FAILED or run.knee_code != FIRST_STEP_FAILED:
        return False
    step = run.step_results.filter(shard__isnull=True, index=0).first()
    return step is not None and answered_all(step)


@pytest.mark.quiet
def test_the_recommendation_counts_only_what_the_pools_members_served(
        haproxy_bin, tiny_backend, celery_worker_factory):
    mine, canary = tiny_backend("mine"), tiny_backend("canary")
    local = make_local_fleet(name="share", subnet=88, node_count=1, backend_address=(mine.address, mine.port))
    try:
        pool = local.listener.default_pool
        route = add_route(local.lb, pool, "/", 10)
        RouteTarget.objects.filter(route=route).update(weight=50)
        RouteTarget.objects.create(route=route, pool=add_pool(local.lb, "canary", (canary.address, canary.port)),
                                   weight=50)
        reconcile(local.fleet)
        TargetAllowlist.objects.create(cidr="127.0.0.0/8", ports="1024-65535", note="loopback only")
        test = CapacityTest.objects.create(
            org=local.lb.org, name="share", listener=local.listener, path="/", mode=CapacityTest.Mode.OPEN,
            steps=[[20.0, 2.0], [40.0, 2.0]], step_duration_s=2.0, slo_p99_ms=500, slo_error_rate=0.05,
            shards=1, safety_factor=0.8, pool=pool, region=pool.regions.get().region, max_connections=20)
        celery_worker_factory(name="share-w1", concurrency=2)
        run = wait_for_run(capacity_run_start(principal=None, test=test).pk, timeout_s=60.0)
        for _ in range(2):
            if not _missed_with_nothing_lost(run):
                break
            # What is checked here is the share of requests the pool served, not latency: a four-worker suite on 2
            # cores saw the 20 req/s step at p99 1027 ms (a stall of the machine) and the run failed before any
            # share was counted. Run again; a run that lost requests is not retried and fails below.
            warnings.warn(f"pool share: the lowest step missed with nothing lost, run again: {run.knee_reason}",
                          stacklevel=1)
            run = wait_for_run(capacity_run_start(principal=None, test=test).pk, timeout_s=60.0)
    finally:
        local.stop_all()

    assert run.status == CapacityRun.Status.SUCCEEDED, (run.error_code, run.error)
    assert run.sent == 20 * 2 + 40 * 2 and run.pool_served is not None
    share = run.pool_served / run.sent
    # Each request draws its pool (rand() on the node): over 120 requests half is 60 +- 5.5, so 0.35-0.65 (2.7
    # sigma) failed about one run in 150 (79 of 120 in one make test). 0.25-0.75 is 5.5 sigma, and still far from
    # counting everything the test sent (1.0), which is what this test is for.
    assert 0.25 <= share <= 0.75, (run.pool_served, run.sent)
    assert mine.hits + canary.hits >= run.sent  # both pools took the test's requests
    assert run.recommended_max_rate_per_member == pytest.approx(run.knee_capacity_rps * share * 0.8, rel=0.02)
    assert f"that the pool's us-east members served ({run.pool_served} of {run.sent} requests" in \
        run.recommendation_note
