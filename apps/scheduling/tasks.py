"""Celery tasks for scheduled jobs: thin wrappers that take ids and call the runner/dispatcher."""

from __future__ import annotations

import contextlib
import os

from celery import shared_task
from celery.signals import worker_process_init
from django.db import connection

from apps.scheduling import dispatcher, notify, runner, services


@shared_task(name="scheduling.dispatch_task", ignore_result=True)
def dispatch_task() -> dict[str, int]:
    """Beat's one-second tick; safe to run twice at once (two beats, or beat and `manage.py dispatcher`)."""
    result = dispatcher.dispatch_due()
    return {"jobs": result.jobs, "runs": result.runs, "catch_up": result.catch_up, "skipped": result.skipped}


@shared_task(name="scheduling.reap_task", ignore_result=True)
def reap_task() -> dict[str, int]:
    result = runner.reap()
    return {"lost": result.lost, "timed_out": result.timed_out, "retried": result.retried,
            "resent": result.resent}


@shared_task(name="scheduling.prune_task", ignore_result=True)
def prune_task() -> int:
    return services.run_history_prune()


@shared_task(name="scheduling.run_job_task", bind=True, ignore_result=True)
def run_job_task(self, run_id: int) -> str:
    """Execute one JobRun. Idempotent: a second delivery of the same message claims nothing."""
    worker = f"{self.request.hostname or 'worker'}/pid{os.getpid()}"
    return runner.run_execute(run_id, worker=worker)


@shared_task(name="scheduling.run_jobs_task", bind=True, ignore_result=True)
def run_jobs_task(self, run_ids: list[int]) -> list[str]:
    """Execute a chunk of quick JobRuns one after another (see runner.CHUNK_SIZE)."""
    worker = f"{self.request.hostname or 'worker'}/pid{os.getpid()}"
    return runner.run_chunk([int(run_id) for run_id in run_ids], worker=worker)


@shared_task(name="scheduling.send_webhook_task", bind=True, ignore_result=True, max_retries=3)
def send_webhook_task(self, run_id: int) -> str:
    outcome = notify.webhook_send(run_id)
    if outcome.retry and self.request.retries < self.max_retries:
        # 10 s, 40 s, 160 s: a receiver that is restarting gets time to come back.
        raise self.retry(countdown=10 * 4 ** self.request.retries)
    return outcome.status


@worker_process_init.connect
def _connect_early(**_: object) -> None:
    """Open each pool process's database connection when it starts, not on the first run of a burst."""
    with contextlib.suppress(Exception):  # no database yet: the first task connects, as it would anyway
        connection.ensure_connection()
