"""Which Celery queue a fleet's reconcile goes to: one of settings.FLEET_QUEUES, by fleet id.

The route lane (apps.fleets.config.routelane) keeps each fleet's last render in the process that made it, so a
fleet's reconciles must always reach the same process: each shard queue is served by one worker process
(runall.worker_commands). Different fleets run in different processes where the shards allow, so their
renders do not share one interpreter lock (two fleets' lane steps in one process took 100-120 ms instead of
50-60 ms each in bench-scale).
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from apps.core.enqueue import enqueue

# Tasks whose first argument is a fleet id and which render it (or read its nodes' rendered bundles).
SHARDED_TASKS = frozenset({"fleets.reconcile_task", "fleets.converge_fleet_task"})

# Coalescing: a change starts a reconcile at once unless one is queued already (it will see the
# change); changes arriving while a rollout runs all go into the next one. So a burst costs at most
# two rollouts per fleet and an isolated change waits for nothing. A debounce (ms) would add its
# whole length to every isolated change's latency; measured with bench_propagation, 20 ms bought
# no fewer rollouts for writes ~30 ms apart, so the default is 0.
DEBOUNCE_S = getattr(settings, "FLEET_ROLLOUT_DEBOUNCE_MS", 0) / 1000.0


def fleet_queue(fleet_id: int) -> str:
    return settings.FLEET_QUEUES[fleet_id % len(settings.FLEET_QUEUES)]


def route_task(name: str, args: Any, kwargs: Any, options: Any, task: Any = None, **kw: Any) -> dict | None:
    """A Celery router (settings.CELERY_TASK_ROUTES): a fleet's render tasks to its shard's queue."""
    if name not in SHARDED_TASKS:
        return None
    fleet_id = args[0] if args else (kwargs or {}).get("fleet_id")
    return {"queue": fleet_queue(int(fleet_id))} if fleet_id is not None else None


def enqueue_reconcile(fleet_id: int) -> bool:
    """Queue fleets.reconcile_task for the fleet (routed to its shard by route_task), after DEBOUNCE_S; False
    when the broker could not be reached."""
    return enqueue("fleets.reconcile_task", fleet_id, countdown=DEBOUNCE_S or None)
