"""Two real dispatcher processes on the same schedules: every slot runs once, and a standby takes over.

Time is compressed: instead of one every-second job for 200 s, ten every-second jobs for
20 s give the same 200 slots (the dispatchers race on ten rows each second instead of one,
which is a harder race, not an easier one). Each job ends after 20 slots (end_at), so the
expected result is exact: 200 runs, one per (job, slot).
"""

from __future__ import annotations

import math
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest

from apps.scheduling.models import JobRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

JOBS = 10
SLOTS = 20


def test_two_dispatchers_at_once_run_every_slot_exactly_once(acme, make_job, dispatcher_factory,
                                                             celery_worker_factory) -> None:
    celery_worker_factory(name="sched-w1", concurrency=2)
    active = dispatcher_factory("active")
    dispatcher_factory("standby")
    start = datetime.fromtimestamp(math.ceil(time.time()) + 2, tz=UTC)
    end = start + timedelta(seconds=SLOTS - 1)
    jobs = [make_job(acme, f"tick-{n}", schedule_type="interval", interval_s=1, start_at=start, end_at=end,
                     concurrency_policy="allow", misfire_grace_s=60) for n in range(JOBS)]
    assert all(job.next_fire_at == start for job in jobs)

    # Halfway through, the active dispatcher dies without a word; the standby carries on alone.
    time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + SLOTS / 2)
    active.send_signal(signal.SIGKILL)
    killed_at = datetime.now(UTC)
    deadline = time.monotonic() + SLOTS / 2 + 30
    while time.monotonic() < deadline:
        if JobRun.objects.filter(job__in=jobs, status__in=JobRun.FINAL).count() >= JOBS * SLOTS:
            break
        time.sleep(0.5)
    time.sleep(2)  # a late duplicate, if any, would show up now

    runs = list(JobRun.objects.filter(job__in=jobs).values_list("job_id", "scheduled_for", "status", "created_at"))
    assert len(runs) == JOBS * SLOTS
    expected = {(job.pk, start + timedelta(seconds=k)) for job in jobs for k in range(SLOTS)}
    assert {(job_id, slot) for job_id, slot, _, _ in runs} == expected
    assert {status for _, _, status, _ in runs} == {"succeeded"}
    # The standby's takeover is immediate: slots after the kill are dispatched (their run row created)
    # within a tick or two, not after a lease expires.
    after_kill = [(created - slot).total_seconds() for _, slot, _, created in runs if slot > killed_at]
    assert after_kill and max(after_kill) < 2.5


def test_a_running_dispatcher_sends_within_seconds_the_runs_whose_sender_died_between_commit_and_send(
        acme, make_job, dispatcher_factory, celery_worker_factory) -> None:
    """GIVEN a dispatcher that keeps running (the standby) and a run committed pending whose message never left:
    its sender (the other dispatcher, an API process) was killed between the commit and the send
    WHEN the standby's reaper next looks
    THEN the run is sent and done within seconds, not after the reaper's 2 minutes for a lost message."""
    from apps.scheduling import runner, services
    from controlplane.celery import app as celery_app
    from tests.waiting import wait_for

    celery_worker_factory(name="orphan-w", concurrency=1)
    dispatcher_factory("standby")
    time.sleep(1)  # the standby's first reap has passed: what follows is its routine, not its start
    dropped: list[runner.Ticket] = []
    with pytest.MonkeyPatch.context() as mp:  # the sender "dies" after its commit: nothing leaves, nothing is marked
        mp.setattr(runner, "send_and_mark", lambda tickets, send=None: dropped.extend(tickets))
        run = services.job_run_now(principal=None, job=make_job(acme, "orphan"))
    assert [t.run_id for t in dropped] == [run.pk] and JobRun.objects.get(pk=run.pk).enqueued_at is None
    assert celery_app.control.purge() == 0  # no message is on its way
    # Expected within UNSENT_AFTER_S (5 s, its age to be called unsent) + a reap period (5 s); a lost message's
    # resend (REENQUEUE_AFTER_S, 120 s) is far past this bound, which leaves room for a loaded machine.
    assert runner.UNSENT_AFTER_S + 5 < 30 < runner.REENQUEUE_AFTER_S
    assert wait_for(lambda: JobRun.objects.get(pk=run.pk).status == "succeeded", 30), \
        JobRun.objects.filter(pk=run.pk).values("status", "enqueued_at").first()
