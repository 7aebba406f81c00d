"""Celery tasks for capacity runs: thin, take ids, idempotent (see apps.capacity.execution)."""

from __future__ import annotations

from celery import shared_task

from apps.capacity import drills, execution


def _enqueue_shard(run_id: int, index: int, time_limit_s: float) -> None:
    # A hard limit a little past the plan's own deadline: the engine stops itself first, this
    # only catches a wedged worker.
    run_shard_task.apply_async((run_id, index), time_limit=int(time_limit_s) + 30,
                               soft_time_limit=int(time_limit_s) + 15)


@shared_task(name="capacity.start_run_task")
def start_run_task(run_id: int) -> str:
    return execution.run_prepare(run_id, _enqueue_shard)


@shared_task(name="capacity.run_shard_task", bind=True)
def run_shard_task(self, run_id: int, shard_index: int) -> str:
    return execution.shard_execute(run_id, shard_index, worker=self.request.hostname or "")


@shared_task(name="capacity.reap_stale_runs_task")
def reap_stale_runs_task() -> int:
    return execution.reap_stale_runs() + drills.reap_lost_drills()


@shared_task(name="capacity.drill_task")
def drill_task(drill_id: int) -> str:
    return drills.drill_execute(drill_id)
