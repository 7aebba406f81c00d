"""A dispatcher killed with SIGKILL for 10 s and restarted: one catch-up run under run_once, none under skip.

Two every-second jobs side by side (misfire_grace_s=2, so the 10 s outage is a misfire and
not merely a late tick), one per policy, through the same kill and restart.
"""

from __future__ import annotations

import math
import signal
import time
from datetime import UTC, datetime, timedelta

import pytest

from apps.scheduling.models import Job, JobRun

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

GRACE_S = 2
OUTAGE_S = 10


def _slots(job: Job, **filters) -> list[datetime]:
    return list(JobRun.objects.filter(job=job, **filters).order_by("scheduled_for")
                .values_list("scheduled_for", flat=True))


def test_a_dispatcher_outage_gives_one_catch_up_under_run_once_and_none_under_skip(
        acme, make_job, dispatcher_factory, celery_worker_factory) -> None:
    celery_worker_factory(name="sched-w1", concurrency=2)
    first = dispatcher_factory("first")
    start = datetime.fromtimestamp(math.ceil(time.time()) + 1, tz=UTC)
    common = {"schedule_type": "interval", "interval_s": 1, "start_at": start, "misfire_grace_s": GRACE_S,
              "concurrency_policy": "allow"}
    once = make_job(acme, "catch-up", misfire_policy="run_once", **common)
    skip = make_job(acme, "skipper", misfire_policy="skip", **common)
    time.sleep(max(0.0, (start - datetime.now(UTC)).total_seconds()) + 4)

    first.send_signal(signal.SIGKILL)
    first.wait(timeout=5)
    last_before = {job.pk: max(_slots(job)) for job in (once, skip)}
    time.sleep(OUTAGE_S)
    # Taken before the restart: the restarted dispatcher may tick before dispatcher_factory returns, and
    # slots within grace of that first tick run as scheduled (measured after, the window took one in).
    back_at = datetime.now(UTC)
    dispatcher_factory("restarted")
    time.sleep(4)
    Job.objects.filter(pk__in=[once.pk, skip.pk]).update(enabled=False, next_fire_at=None)
    deadline = time.monotonic() + 20
    while JobRun.objects.filter(job__in=[once, skip], status__in=["pending", "running"]).exists():
        assert time.monotonic() < deadline, "runs did not finish"
        time.sleep(0.3)

    def outage(job: Job) -> tuple[datetime, datetime]:
        """The slots the outage took: after the last one handed out before the kill, before the first one
        the restarted dispatcher ran on schedule (that one within grace of its restart: asserted below)."""
        resumed = min(s for s in _slots(job, trigger="schedule") if s > last_before[job.pk])
        assert resumed >= back_at - timedelta(seconds=GRACE_S + 1), "missed slots were run as if on time"
        return last_before[job.pk], resumed

    def missed_window(slot: datetime, job: Job) -> bool:
        low, high = outage(job)
        return low < slot < high

    # run_once: exactly one run stands for the whole outage, marked as a catch-up.
    in_gap = [s for s in _slots(once) if missed_window(s, once)]
    assert len(in_gap) == 1
    catch_up = JobRun.objects.get(job=once, scheduled_for=in_gap[0])
    assert catch_up.trigger == "catch_up" and catch_up.status == "succeeded"
    assert catch_up.missed_since == last_before[once.pk] + timedelta(seconds=1)
    assert JobRun.objects.filter(job=once, trigger="catch_up").count() == 1
    # skip: nothing ran for the outage; one skipped record says what was missed.
    assert [s for s in _slots(skip, status="succeeded") if missed_window(s, skip)] == []
    skipped = JobRun.objects.get(job=skip, status="skipped")
    assert skipped.missed_since == last_before[skip.pk] + timedelta(seconds=1)
    assert "misfire policy skip" in skipped.error
    # Both: before the kill and after the restart, every slot ran once, second by second.
    for job in (once, skip):
        ran = _slots(job, status="succeeded", trigger="schedule")
        before = [s for s in ran if s <= last_before[job.pk]]
        after = [s for s in ran if s > last_before[job.pk]]
        assert before == [start + timedelta(seconds=k) for k in range(len(before))]
        assert after and after == [after[0] + timedelta(seconds=k) for k in range(len(after))]
