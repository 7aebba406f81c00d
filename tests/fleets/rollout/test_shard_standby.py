"""Two real workers on one fleet shard queue: one consumes, the other stands by and takes over when it is killed."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.fleets import services
from apps.fleets.models import Fleet
from apps.fleets.rollout import shards
from apps.fleets.rollout.queues import fleet_queue
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, make_local_fleet, reconcile
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy, pytest.mark.slow]


@pytest.fixture
def fleet2(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    old = tiny_backend("old")
    local = make_local_fleet(name="standby", subnet=79, node_count=2, backend_address=(old.address, old.port))
    try:
        yield local
    finally:
        local.stop_all()


def _received(log: Path) -> int:
    return log.read_text().count("Task fleets.reconcile_task[")


@pytest.mark.django_db(transaction=True)
def test_a_standby_shard_worker_consumes_nothing_until_the_holder_is_killed_then_takes_the_queue_over(
    fleet2: LocalFleet, tiny_backend, celery_worker_factory, tmp_path
) -> None:
    reconcile(fleet2.fleet)
    queue = fleet_queue(fleet2.fleet.pk)
    new = tiny_backend("new")
    pool = add_pool(fleet2.lb, "new", (new.address, new.port))
    primary = celery_worker_factory(name="shard-a", concurrency=2, queues=queue, pool="threads")
    assert wait_for(lambda: ":shard-a@" in (shards.lease_holder(queue) or ""), 10)
    celery_worker_factory(name="shard-b", concurrency=2, queues=queue, pool="threads")
    log_a, log_b = tmp_path / "celery-shard-a.log", tmp_path / "celery-shard-b.log"
    assert wait_for(lambda: "stands by" in log_b.read_text(), 10), log_b.read_text()[-2000:]

    # Three changes while both live: every reconcile runs in the holder, whose route lane stays warm.
    for n in range(3):
        add_route(fleet2.lb, pool, f"/one{n}", 10 + n)
        services.fleet_mark_changed(fleet=fleet2.fleet)
        assert wait_for(lambda n=n: set(fleet2.bodies(f"/one{n}").values()) == {"new"}, 30)
    assert _received(log_a) >= 1
    assert _received(log_b) == 0, log_b.read_text()[-2000:]

    os.kill(primary.pid, signal.SIGKILL)
    primary.wait(5)
    # What a worker killed holding the fleet's reconcile leaves: the flag that says one is queued, so a change
    # queues nothing more. Only the standby's takeover reconciles it before the periodic converge.
    Fleet.objects.filter(pk=fleet2.fleet.pk).update(reconcile_queued=True)
    add_route(fleet2.lb, pool, "/two", 20)
    services.fleet_mark_changed(fleet=fleet2.fleet)
    assert wait_for(lambda: set(fleet2.bodies("/two").values()) == {"new"}, 30), log_b.read_text()[-3000:]
    assert ":shard-b@" in (shards.lease_holder(queue) or "")
    assert "takes the queue over" in log_b.read_text()
    assert _received(log_b) >= 1
