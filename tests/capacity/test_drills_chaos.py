"""The control plane fails in the middle of a drill: the Celery worker running it is killed (SIGKILL) while the
region is drained. The drain is a lease the drill renews every second, so the region serves its own traffic again
within the lease (DRAIN_LEASE_S), not at the end of the drill's hour; the reaper then marks the drill lost and
says so in an event. Real worker (solo pool: the drill runs in the process that dies), real 2 x 2 HAProxy fleet."""

from __future__ import annotations

import signal
import time

import pytest

from apps.accounts.principal import Principal
from apps.capacity import drills, services
from apps.capacity.models import Drill
from apps.events.models import Event
from tests.traffic.livekit import NODES, EnforcerThread, Load, start

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.haproxy]


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _ra_rate(fleet, seconds: float = 0.5) -> float:
    before = fleet.hits().get("ra", 0)
    time.sleep(seconds)
    return (fleet.hits().get("ra", 0) - before) / seconds


def test_a_drill_whose_worker_dies_gives_the_region_back_within_its_lease(
        two_regions, haproxy_node, tiny_backend, celery_worker_factory) -> None:
    fleet = start(two_regions, haproxy_node, tiny_backend)
    worker = celery_worker_factory(name="drill-doomed", concurrency=1, pool="solo")
    enforcer = EnforcerThread()
    load = Load(NODES["ra1"][1], fleet.port, 30.0, duration_s=40.0)
    try:
        drill = services.drill_start(principal=Principal(org=two_regions.pool.org, role="owner"), pool=fleet.pool,
                                     region="ra", duration_s=3600.0)
        _until(lambda: Drill.objects.get(pk=drill.pk).phase == "drained", 30, "the drain")
        time.sleep(1.5)
        assert _ra_rate(fleet) <= 2.0  # drained: ra's members serve nothing
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=10)
        killed = time.monotonic()
        _until(lambda: _ra_rate(fleet, 0.25) >= 20.0, 30, "ra to serve again")
        back_after = time.monotonic() - killed
    finally:
        enforcer.close()
        load.stop()
    assert back_after <= drills.DRAIN_LEASE_S + 2.0, back_after  # the lease, the enforcer's period, HAProxy's rate
    assert drills.reap_lost_drills(stale_s=1.0) == 1
    drill.refresh_from_db()
    assert (drill.status, drill.failed_check) == ("failed", "lost")
    event = Event.objects.get(type="drill.failed")
    assert event.data["check"] == "lost"
