"""A standby that takes a fleet shard queue over queues the shard's reconciles twice: at once, and again one lease
step later. A holder killed a moment before can still have a BRPOP waiting in Redis, which takes the first message
until Redis has seen its connection close; that reconcile was lost once (tests/fleets/rollout/test_shard_standby.py
failed in a make test: the change waited for the periodic converge)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.core.cache import cache

from apps.fleets.rollout import shards

pytestmark = pytest.mark.skipif(not shards.settings.REDIS_URL, reason="the shard lease lives in the Redis cache")


@pytest.fixture
def queued(monkeypatch) -> list[str]:
    calls: list[str] = []
    monkeypatch.setattr(shards, "_take_over_here", calls.append)
    return calls


def _consumer() -> SimpleNamespace:
    return SimpleNamespace(hostname="w@test", call_soon=lambda fn, *args: fn(*args),
                           add_task_queue=lambda queue: None, cancel_task_queue=lambda queue: None)


def test_a_standby_that_takes_over_queues_the_shards_reconciles_now_and_once_more_at_the_next_step(queued) -> None:
    queue = shards.settings.FLEET_QUEUES[0]
    key = shards._KEY.format(queue)
    cache.set(key, "elsewhere:1:other@host:abcd", timeout=30)
    keeper = shards.ShardKeeper(_consumer(), queue)
    try:
        keeper.step()
        assert keeper.holding is False and queued == []
        cache.delete(key)  # the holder is gone
        keeper.step()
        assert keeper.holding and queued == [queue]
        keeper.step()
        assert queued == [queue, queue]
        keeper.step()
        keeper.step()
        assert queued == [queue, queue]  # holding on costs nothing more
    finally:
        shards.lease_release(queue, keeper.token)


def test_a_worker_just_started_queues_them_once(queued) -> None:
    queue = shards.settings.FLEET_QUEUES[0]
    cache.delete(shards._KEY.format(queue))
    keeper = shards.ShardKeeper(_consumer(), queue)
    try:
        for _ in range(3):
            keeper.step()
        assert keeper.holding and queued == [queue]
    finally:
        shards.lease_release(queue, keeper.token)


def test_a_standby_that_never_held_the_queue_queues_nothing(queued) -> None:
    queue = shards.settings.FLEET_QUEUES[0]
    cache.set(shards._KEY.format(queue), "elsewhere:1:other@host:abcd", timeout=30)
    keeper = shards.ShardKeeper(_consumer(), queue)
    try:
        keeper.step()
        keeper.step()
        assert keeper.holding is False and queued == []
    finally:
        cache.delete(shards._KEY.format(queue))
