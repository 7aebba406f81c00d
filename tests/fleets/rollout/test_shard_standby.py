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
from tests.fleets.fleetkit import LocalFleet, add_pool, add_route, reconcile, serving_local_fleet
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy, pytest.mark.slow]


@pytest.fixture
def fleet2(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="standby", subnet=79, node_count=2) as local:
        yield local


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


@pytest.mark.django_db(transaction=True)
def test_a_worker_of_another_shard_covers_a_queue_whose_own_workers_are_all_gone_and_hands_it_back(
    fleet2: LocalFleet, tiny_backend, celery_worker_factory, tmp_path, settings
) -> None:
    reconcile(fleet2.fleet)
    queue = fleet_queue(fleet2.fleet.pk)
    other_queue = next(q for q in settings.FLEET_QUEUES if q != queue)
    new = tiny_backend("new")
    pool = add_pool(fleet2.lb, "new", (new.address, new.port))
    own = celery_worker_factory(name="own", concurrency=2, queues=queue, pool="threads")
    assert wait_for(lambda: ":own@" in (shards.lease_holder(queue) or ""), 10)
    # Covering from its start (by default a worker covers once it has run 15 s: workers started together boot
    # seconds apart, tests/fleets/config/test_route_lane.py).
    celery_worker_factory(name="neighbour", concurrency=2, queues=other_queue, pool="threads",
                          FLEET_SHARD_COVER_AFTER_S="0")
    log_neighbour = tmp_path / "celery-neighbour.log"
    add_route(fleet2.lb, pool, "/one", 10)
    services.fleet_mark_changed(fleet=fleet2.fleet)
    assert wait_for(lambda: set(fleet2.bodies("/one").values()) == {"new"}, 30)
    assert _received(log_neighbour) == 0, "a live shard's queue is its own workers'"

    # Every worker of the shard gone: the neighbour covers its queue, and a change goes live without a restart.
    os.kill(own.pid, signal.SIGKILL)
    own.wait(5)
    add_route(fleet2.lb, pool, "/two", 20)
    services.fleet_mark_changed(fleet=fleet2.fleet)
    assert wait_for(lambda: set(fleet2.bodies("/two").values()) == {"new"}, 30), log_neighbour.read_text()[-3000:]
    assert "covers it" in log_neighbour.read_text()
    assert _received(log_neighbour) >= 1
    assert "covering" in (shards.lease_holder(queue) or "")

    # A worker of the shard's own comes back: the neighbour hands the queue back, and later changes go to it.
    celery_worker_factory(name="back", concurrency=2, queues=queue, pool="threads")
    log_back = tmp_path / "celery-back.log"
    assert wait_for(lambda: ":back@" in (shards.lease_holder(queue) or ""), 10), log_neighbour.read_text()[-3000:]
    assert "hands the queue back" in log_neighbour.read_text()
    received = _received(log_neighbour)
    add_route(fleet2.lb, pool, "/three", 30)
    services.fleet_mark_changed(fleet=fleet2.fleet)
    assert wait_for(lambda: set(fleet2.bodies("/three").values()) == {"new"}, 30), log_back.read_text()[-3000:]
    assert _received(log_back) >= 1
    assert _received(log_neighbour) == received
