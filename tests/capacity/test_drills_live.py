"""Failover drills on a real fleet (2 regions x 2 HAProxy nodes, tests/traffic/livekit.py): the drill
drains ra while 30 req/s arrive at ra1, and its report is compared with what the members themselves served.

The enforcement loop runs in a thread 4 times a second, as the enforcer process does; the drill runs in
another (the Celery task's body), so the test is transactional."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection

from apps.accounts.principal import Principal
from apps.balancers.models import Pool, PoolRegion
from apps.capacity import drills, services
from apps.capacity.engine.results import NON_2XX
from apps.capacity.models import Drill
from apps.events.models import Event
from apps.fleets.selectors import pool_counters
from apps.traffic.selectors import pool_steering_now
from tests.traffic.livekit import NODES, EnforcerThread, Load, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.haproxy]


def _run_drill(drill_id: int) -> threading.Thread:
    def body() -> None:
        try:
            drills.drill_execute(drill_id)
        finally:
            connection.close()

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    return thread


def _wait_phase(drill_id: int, phase: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while Drill.objects.get(pk=drill_id).phase != phase:
        assert time.monotonic() < deadline, f"drill never reached {phase}"
        time.sleep(0.05)


def test_a_drill_drains_a_region_and_its_report_matches_what_the_members_served(
        two_regions, haproxy_node, tiny_backend) -> None:
    """GIVEN 30 req/s arriving at ra1 (ra's capacity 40: all served in ra)
    WHEN a drill drains ra for 6 s
    THEN ra's members serve nothing while drained and rb's serve it all, the report's figures match the
    members' own counts within 10%, the drain is gone afterwards, and one drill.started + one drill.passed."""
    fleet = start(two_regions, haproxy_node, tiny_backend)
    owner = Principal(org=two_regions.pool.org, role="owner")
    enforcer = EnforcerThread()
    load = Load(NODES["ra1"][1], fleet.port, 30.0, duration_s=18.0)
    try:
        time.sleep(2.0)
        drill = services.drill_start(principal=owner, pool=fleet.pool, region="ra", duration_s=6.0)
        thread = _run_drill(drill.pk)
        _wait_phase(drill.pk, "drained")
        time.sleep(1.5)  # the enforcer's reaction, and HAProxy's 1 s sliding rate
        h1, t1 = fleet.hits(), time.monotonic()
        _wait_phase(drill.pk, "restored")
        h2, t2 = fleet.hits(), time.monotonic()
        thread.join(30)
    finally:
        enforcer.close()
        load.stop()
    drill.refresh_from_db()
    assert drill.status == Drill.Status.PASSED, (drill.failed_check, drill.reason)
    members = {r: (h2.get(r, 0) - h1.get(r, 0)) / (t2 - t1) for r in ("ra", "rb")}
    assert members["ra"] <= 1.0 and members["rb"] >= 27.0, members  # the drain, as the members saw it
    summary = drill.summary
    assert summary["before"]["ra"] == pytest.approx(30.0, rel=0.1), summary
    assert summary["during"]["rb"] == pytest.approx(members["rb"], rel=0.1), (summary, members)
    assert summary["during"]["ra"] <= 1.0, summary
    assert summary["moved"]["rb"] == pytest.approx(30.0, rel=0.15), summary
    # Sampled each second: the drained region is at its target by the second sample after the drain (2 s + jitter).
    assert summary["react_s"] is not None and summary["react_s"] <= 2.5, summary
    assert {s["phase"] for s in drill.samples} == {"baseline", "drained", "restored"}
    assert drill.finished_at is not None and (drill.finished_at - drill.started_at).total_seconds() <= 6.0 + 10.0
    assert "ra" not in pool_steering_now(Pool.objects.get(pk=fleet.pool.pk)).drained  # restored
    events = list(Event.objects.filter(type__startswith="drill.").order_by("pk").values_list("type", flat=True))
    assert events == ["drill.started", "drill.passed"]


def test_a_drill_that_breaks_its_slo_restores_at_once_and_says_why(two_regions, haproxy_node, tiny_backend) -> None:
    """GIVEN a pool that sheds when full, rb with room for 20 req/s only, 30 req/s arriving at ra1
    WHEN a 20 s drill drains ra
    THEN rb cannot take it: a third is shed (503), the drill fails on its error rate within a few seconds,
    ra serves again at once (not after 20 s), and one drill.failed event names the check."""
    PoolRegion.objects.filter(pool=two_regions.pool, region=two_regions.b).update(capacity_scaler=0.25)  # 20 req/s
    fleet = start(two_regions, haproxy_node, tiny_backend, overload="shed")
    owner = Principal(org=two_regions.pool.org, role="owner")
    enforcer = EnforcerThread()
    load = Load(NODES["ra1"][1], fleet.port, 30.0, duration_s=16.0)
    try:
        time.sleep(2.0)
        drill = services.drill_start(principal=owner, pool=fleet.pool, region="ra", duration_s=20.0,
                                     slo_error_rate=0.05)
        started = time.monotonic()
        _run_drill(drill.pk).join(30)
        took = time.monotonic() - started
        time.sleep(1.5)
        h1, t1 = fleet.hits(), time.monotonic()
        time.sleep(2.0)
        h2, t2 = fleet.hits(), time.monotonic()
    finally:
        enforcer.close()
        load.stop()
    # The nodes' own count of shed answers is what the clients got: every 503 they saw, no more.
    counters, _ = pool_counters(fleet.pool)
    total = load.result.total  # type: ignore[union-attr]
    shed = sum(c.shed or 0 for c in counters.values())
    assert total.errors.get(NON_2XX, 0) - load.result.abandoned <= shed <= total.errors.get(NON_2XX, 0), (  # type: ignore[union-attr]
        shed, total.errors)
    assert shed >= 10
    drill.refresh_from_db()
    assert drill.status == Drill.Status.FAILED and drill.failed_check == "error_rate", (drill.status, drill.reason)
    assert "failed over the last 3 s" in drill.reason
    assert took < 3 + 10, took  # restored at its failure, not at the end of its 20 s window
    assert (h2["ra"] - h1["ra"]) / (t2 - t1) >= 20.0  # ra serves its own traffic again
    failed = Event.objects.get(type="drill.failed")
    assert failed.data["check"] == "error_rate"
    assert drill.summary["max_error_rate"] >= 0.05
