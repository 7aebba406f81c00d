"""The default deployment: Celery beat ticks `scheduling.dispatch_task` every second and a worker runs it.

Real beat (django-celery-beat's database scheduler) and a real worker; an every-second job
runs once per slot for a few seconds.
"""

from __future__ import annotations

import math
import signal
import subprocess
import time
from datetime import UTC, datetime, timedelta

import pytest

from apps.scheduling.models import JobRun
from tests.processes import ForkedProcess, process_env, start_python, stop_process, stop_processes
from tests.waiting import wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

SLOTS = 6


def test_beat_drives_the_dispatcher_and_every_slot_runs_once(acme, make_job, celery_worker_factory,
                                                             tmp_path) -> None:
    celery_worker_factory(name="beat-w1", concurrency=2)
    beat = start_python(["-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO",
                         "--schedule", str(tmp_path / "beat-schedule")], process_env(), tmp_path / "beat.log")
    try:
        start = datetime.fromtimestamp(math.ceil(time.time()) + 4, tz=UTC)
        end = start + timedelta(seconds=SLOTS - 1)
        job = make_job(acme, "beat-driven", schedule_type="interval", interval_s=1, start_at=start, end_at=end,
                       concurrency_policy="allow", misfire_grace_s=60)
        deadline = time.monotonic() + 4 + SLOTS + 25
        while JobRun.objects.filter(job=job, status="succeeded").count() < SLOTS:
            assert time.monotonic() < deadline, (tmp_path / "beat.log").read_text()[-2000:]
            time.sleep(0.5)
        time.sleep(2)
    finally:
        stop_process(beat)
    slots = sorted(JobRun.objects.filter(job=job).values_list("scheduled_for", flat=True))
    assert slots == [start + timedelta(seconds=k) for k in range(SLOTS)]


def _beat(tmp_path, name: str) -> subprocess.Popen | ForkedProcess:
    return start_python(["-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO",
                         "--schedule", str(tmp_path / f"{name}-schedule")], process_env(), tmp_path / f"{name}.log")


def _sent(tmp_path, name: str) -> int:
    return (tmp_path / f"{name}.log").read_text().count("Sending due task")


def test_a_second_beat_stands_by_sends_nothing_and_leads_within_seconds_once_the_first_is_killed(
    tmp_path,
) -> None:
    """Two beats: only the lease holder sends (two senders doubled every periodic task); killed with
    SIGKILL, its standby sends the schedule after the lease runs out (controlplane/beat.py: 5 s)."""
    first = _beat(tmp_path, "beat-a")
    procs = [first]
    try:
        assert wait_for(lambda: _sent(tmp_path, "beat-a") > 0, 30), (tmp_path / "beat-a.log").read_text()[-2000:]
        procs.append(_beat(tmp_path, "beat-b"))
        assert wait_for(lambda: "stands by" in (tmp_path / "beat-b.log").read_text(), 30)
        sent_before = _sent(tmp_path, "beat-a")
        time.sleep(3)  # the every-second tasks keep going out, from the leader only
        assert _sent(tmp_path, "beat-a") > sent_before
        assert _sent(tmp_path, "beat-b") == 0
        first.send_signal(signal.SIGKILL)
        first.wait(5)
        # LEASE_S + RENEW_S = 6 s, with a slow machine's margin
        assert wait_for(lambda: _sent(tmp_path, "beat-b") > 0, 15), (tmp_path / "beat-b.log").read_text()[-2000:]
    finally:
        stop_processes(procs)
