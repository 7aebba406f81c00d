"""A Celery worker killed with SIGKILL in the middle of runs: each run is retried or failed, never left running.

GIVEN two sleeping runs on a real worker, one job with a retry left and one without,
WHEN the worker (its pool process and its main process) is SIGKILLed,
THEN the reaper in the dispatcher process sees their heartbeats stop: the first is retried
on a second worker, the second is marked failed with "worker lost".
"""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from apps.scheduling import services
from apps.scheduling.models import JobRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

STALE_AFTER_S = 4


def _wait(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _status(run: JobRun) -> tuple[str, int, str]:
    run.refresh_from_db()
    return run.status, run.attempt, run.worker


def test_runs_of_a_killed_worker_are_retried_or_failed(acme, make_job, dispatcher_factory,
                                                       celery_worker_factory) -> None:
    doomed = celery_worker_factory(name="doomed", concurrency=2)
    dispatcher_factory("reaper", "--reap-every-s", "1", "--stale-after-s", str(STALE_AFTER_S))
    retried_job = make_job(acme, "retried", params={"sleep_s": 60}, max_retries=1, retry_backoff_s=0)
    failed_job = make_job(acme, "failed", params={"sleep_s": 60}, max_retries=0)
    retried = services.job_run_now(principal=None, job=retried_job)
    failed = services.job_run_now(principal=None, job=failed_job)
    _wait(lambda: _status(retried)[0] == "running" and _status(failed)[0] == "running", 30, "both runs to start")

    # The pool processes are named in run.worker ("doomed@host/pid123"): kill them and the main process.
    pids = {int(re.search(r"/pid(\d+)$", run.worker).group(1)) for run in (retried, failed)}
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    doomed.send_signal(signal.SIGKILL)
    doomed.wait(timeout=10)
    killed_at = time.monotonic()

    celery_worker_factory(name="survivor", concurrency=1)
    _wait(lambda: _status(failed)[0] == "failed", STALE_AFTER_S + 20, "the run without retries to fail")
    assert failed.error.startswith("worker lost: doomed@")
    _wait(lambda: _status(retried)[:2] == ("running", 2), STALE_AFTER_S + 30, "the retry to start")
    assert retried.worker.startswith("survivor@")
    assert retried.attempts[0]["status"] == "failed" and "worker lost" in retried.attempts[0]["error"]
    assert time.monotonic() - killed_at < STALE_AFTER_S + 30
    # Done with the demonstration: stop the 60 s sleep of the retry.
    services.run_cancel(principal=None, run=retried)
    _wait(lambda: not JobRun.objects.filter(status="running").exists(), 10, "nothing left running")
