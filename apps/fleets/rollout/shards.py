"""Standby fleet shard workers: two or more workers may serve one shard queue, and one consumes it at a time.

Each fleet's route lane lives in the process that last rendered it (config/routelane.py), so a shard queue
is best served by one process: a reconcile landing in another one renders all of the fleet's routes again.
That made the shard worker a singleton, and a killed one stopped every fleet of its shard until a human
restarted it. Now every worker started on a `fleets.N` queue takes part in a lease per queue (in the cache,
as the enforcer's): the holder consumes and renews it every RENEW_S; the others cancel their consumer and
try the lease as often. A holder killed with `kill -9` stops renewing; a standby takes the lease after at
most LEASE_S (at once on the same host, where it sees the holder's process gone), starts consuming, and
queues a reconcile for every fleet of the shard: the message the dead worker held (acknowledged late,
redelivered only after the broker's visibility timeout) is then not waited for, and neither is a
`reconcile_queued` flag it left set. A holder that could not renew in time (a stalled process) stops
consuming, so two consumers overlap for at most one renewal: that costs a lane render, not correctness (the
fleet lease still lets one reconciler at a time touch the nodes).

When every worker of a shard is gone at once (all of them killed, or a host lost), a worker of another shard
covers the queue (ShardCover): it steps in after the shard's own standbys had COVER_GRACE_S to, consumes the
queue and hands it back as soon as one of the shard's own workers stands by again. bench-chaos: "kill all
fleets-1" left the shard's fleets to their supervisor's restart and a Celery boot, 6-16 s on a loaded host.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import connection

from apps.core.locks import cache_lease, process_gone, process_token

logger = logging.getLogger(__name__)

# Whole seconds (a Redis expiry). 3 s made a killed holder's changes wait ~7 s in bench-chaos; GC pauses here reach
# ~0.5 s, and a holder that misses it only shares its queue for a moment (the fleet lease keeps one reconciler).
LEASE_S = 2  # a holder that has not renewed for this long has lost its queue to a standby
RENEW_S = 0.4  # how often a holder renews and a standby tries (a takeover waits LEASE_S + RENEW_S at most)
# A shard's own standbys try every RENEW_S: a worker of another shard steps in only after they had two tries.
COVER_GRACE_S = 2 * RENEW_S
# A worker covers other shards only once it has run this long: workers started together boot seconds apart, and a
# cover taken then would be handed back at once, a full render of the shard's lanes twice for nothing.
COVER_AFTER_START_S = float(getattr(settings, "FLEET_SHARD_COVER_AFTER_S", 15))
_KEY = "spillway:fleet-shard:{}"
_WAITING = "spillway:fleet-shard-waiting:{}"  # one of the shard's own workers stands by (a cover hands back)


def lease_try(queue: str, token: str) -> bool:
    """Take or renew the queue's lease; False while another worker holds it (or the cache is unreachable)."""
    return cache_lease(_KEY.format(queue), token, LEASE_S)


def lease_holder(queue: str) -> str | None:
    return cache.get(_KEY.format(queue))


def own_worker_waiting(queue: str) -> bool:
    try:
        waiting = cache.get(_WAITING.format(queue))
    except Exception:  # unreachable cache: a cover keeps the queue (its lease renewal fails too, and it stops)
        return False
    return isinstance(waiting, str) and not process_gone(waiting)


def lease_release(queue: str, token: str) -> None:
    key = _KEY.format(queue)
    try:
        if cache.get(key) == token:
            cache.delete(key)
    except Exception:  # noqa: S110 (expires by itself)
        pass


def shard_fleet_ids(queue: str) -> list[int]:
    from apps.fleets.models import Fleet

    shards = len(settings.FLEET_QUEUES)
    index = settings.FLEET_QUEUES.index(queue)
    return [pk for pk in Fleet.objects.values_list("pk", flat=True) if pk % shards == index]


def take_over(queue: str) -> list[int]:
    """Queue a reconcile for every fleet of the shard (the new holder rebuilds its lanes and finishes what the
    last one left), whatever their reconcile_queued says: that flag may name a message the dead worker held."""
    from apps.fleets.models import Fleet
    from apps.fleets.rollout.queues import enqueue_reconcile

    fleet_ids = shard_fleet_ids(queue)
    for fleet_id in fleet_ids:
        Fleet.objects.filter(pk=fleet_id).update(reconcile_queued=True)
        if not enqueue_reconcile(fleet_id):
            # Not sent (the broker is coming back: a takeover follows a Redis restart too). A flag left set made
            # every later change of the fleet wait for the periodic converge (bench-chaos: 19 s to converge).
            Fleet.objects.filter(pk=fleet_id).update(reconcile_queued=False)
    return fleet_ids


def _take_over_here(queue: str) -> None:
    """take_over from a keeper's or cover's thread."""
    try:
        take_over(queue)
    except Exception:  # the periodic converge reconciles them anyway
        logger.exception("fleet shard %s: queueing the shard's reconciles failed", queue)
    finally:
        connection.close()  # this thread's own: the worker keeps one connection per task thread


class _QueueLeaseThread(threading.Thread):
    """A worker's thread that steps on a queue's lease every RENEW_S (from `start_after_s` on) until stopped, and
    releases the lease if it holds it then."""

    start_after_s = 0.0
    holding: bool | None
    token: str

    def __init__(self, consumer: Any, queue: str, name: str) -> None:
        super().__init__(name=name, daemon=True)
        self.consumer, self.queue = consumer, queue
        self.stopped = threading.Event()

    def step(self) -> None:
        raise NotImplementedError

    def run(self) -> None:
        if self.stopped.wait(self.start_after_s):
            return
        while not self.stopped.is_set():
            try:
                self.step()
            except Exception:  # a thread that dies would leave the queue to no one
                logger.exception("fleet shard %s: %s step failed", self.queue, type(self).__name__)
            self.stopped.wait(RENEW_S)
        if self.holding:
            lease_release(self.queue, self.token)


class ShardKeeper(_QueueLeaseThread):
    """In a worker: hold the queue's lease and consume it, or wait as its standby with the consumer cancelled.
    Consumer operations run in the consumer's own loop (consumer.call_soon), as Celery's remote control does."""

    def __init__(self, consumer: Any, queue: str) -> None:
        super().__init__(consumer, queue, f"spillway-shard-{queue}")
        # This host and process in the token: a standby on the same host takes the queue over as soon as this
        # process is gone (cache_lease), not LEASE_S later; one elsewhere waits LEASE_S.
        self.token = process_token(consumer.hostname)
        # None: just started, consuming the queue (a worker restarted by a supervisor takes over like a standby)
        self.holding = None
        # A standby that takes over queues the shard's reconciles once more at its next step: it comes within
        # milliseconds of its holder's death (process_gone), when the dead worker may still have a BRPOP waiting in
        # Redis, which Redis answers with the next message until it has seen the connection close. The takeover's
        # reconcile went to the dead worker that way and was lost (a make test saw it once), and the change waited
        # for the periodic converge. Measured on Redis 7: an LPUSH sent as soon as /proc shows the BRPOP's process
        # a zombie was lost 117 times in 200; sent after the process was reaped, 0 in 200. The second costs a
        # reconcile that finds nothing to do. A worker just started or a cover comes seconds after any death (a
        # boot, COVER_GRACE_S): once is enough.
        self.again = False

    def step(self) -> None:
        held = lease_try(self.queue, self.token)
        if held and not self.holding:
            logger.warning("fleet shard %s: this worker (%s) takes the queue over", self.queue,
                           self.consumer.hostname)
            standby = self.holding is False
            if standby:
                self.consumer.call_soon(self.consumer.add_task_queue, self.queue)
            self.holding, self.again = True, standby
            _take_over_here(self.queue)
        elif held:
            if self.again:
                self.again = False
                _take_over_here(self.queue)
        else:
            if self.holding is not False:
                logger.warning("fleet shard %s: held by another worker (%s); this one stands by", self.queue,
                               lease_holder(self.queue))
                self.consumer.call_soon(self.consumer.cancel_task_queue, self.queue)
                self.holding = False
            # A worker of another shard covering the queue hands it back when it sees this. An unreachable cache
            # fails the lease step the same way, and that is logged.
            with contextlib.suppress(Exception):
                cache.set(_WAITING.format(self.queue), self.token, timeout=LEASE_S)



class ShardCover(_QueueLeaseThread):
    """In a worker of another shard: consume a queue that none of its own workers holds, and hand it back as soon
    as one of them stands by. The price of covering is a render of the shard's lanes here, and another on return."""

    start_after_s = COVER_AFTER_START_S

    def __init__(self, consumer: Any, queue: str) -> None:
        super().__init__(consumer, queue, f"spillway-cover-{queue}")
        self.token = process_token(f"{consumer.hostname} covering")
        self.holding = False
        self.vacant_since: float | None = None

    def _vacant(self) -> bool:
        try:
            holder = lease_holder(self.queue)
        except Exception:  # an unreachable cache tells nothing (and no one could send the queue a message)
            return False
        return holder is None or process_gone(holder)

    def step(self) -> None:
        if self.holding:
            if not own_worker_waiting(self.queue) and lease_try(self.queue, self.token):
                return
            logger.warning("fleet shard %s: %s hands the queue back", self.queue, self.consumer.hostname)
            self.consumer.call_soon(self.consumer.cancel_task_queue, self.queue)
            lease_release(self.queue, self.token)
            self.holding, self.vacant_since = False, None
            return
        if not self._vacant():
            self.vacant_since = None
            return
        now = time.monotonic()
        if self.vacant_since is None:
            self.vacant_since = now
        if now - self.vacant_since < COVER_GRACE_S or not lease_try(self.queue, self.token):
            return
        logger.warning("fleet shard %s: no worker of its own holds it; %s covers it", self.queue,
                       self.consumer.hostname)
        self.consumer.call_soon(self.consumer.add_task_queue, self.queue)
        self.holding = True
        _take_over_here(self.queue)



_KEEPERS: list[_QueueLeaseThread] = []


def start_keepers(consumer: Any) -> list[_QueueLeaseThread]:
    """For each fleet shard queue the worker consumes, a keeper (the first step runs here, before the worker
    takes a second message), and a cover for each other shard queue. Without a shared cache (SQLite `make run`:
    one worker per shard) there is none."""
    if not getattr(settings, "REDIS_URL", None):
        return []
    consuming = [q for q in settings.FLEET_QUEUES if consumer.task_consumer.consuming_from(q)]
    for queue in consuming:
        keeper = ShardKeeper(consumer, queue)
        keeper.step()
        keeper.start()
        _KEEPERS.append(keeper)
    if consuming:
        for queue in settings.FLEET_QUEUES:
            if queue not in consuming:
                cover = ShardCover(consumer, queue)
                cover.start()
                _KEEPERS.append(cover)
    return list(_KEEPERS)


def stop_keepers() -> None:
    for keeper in _KEEPERS:
        keeper.stopped.set()
    for keeper in _KEEPERS:
        keeper.join(timeout=2)
    _KEEPERS.clear()
