"""The dispatcher against the database, driven with a fake clock (no worker: `send` collects tickets)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from apps.scheduling import planning
from apps.scheduling.dispatcher import dispatch_due, dispatch_once
from apps.scheduling.models import Job, JobRun

pytestmark = pytest.mark.django_db


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def set_next(job: Job, when: datetime | None) -> None:
    Job.objects.filter(pk=job.pk).update(next_fire_at=when)


def slots(job: Job, **filters) -> list[datetime]:
    return list(JobRun.objects.filter(job=job, **filters).order_by("scheduled_for")
                .values_list("scheduled_for", flat=True))


def test_a_due_job_gets_one_pending_run_and_its_next_slot(acme, make_job) -> None:
    start = utc(2026, 5, 4, 12, 0, 0)
    job = make_job(acme, "every-minute", interval_s=60, start_at=start)
    set_next(job, start)
    sent: list = []
    result = dispatch_once(now=start + timedelta(milliseconds=5), send=sent.extend)
    assert (result.jobs, result.runs) == (1, 1)
    run = JobRun.objects.get(job=job)
    assert run.scheduled_for == start and run.status == "pending" and run.trigger == "schedule"
    job.refresh_from_db()
    assert job.next_fire_at == start + timedelta(minutes=1)
    # Nothing is due any more at the same instant: a second tick (or a second dispatcher) adds nothing.
    assert dispatch_once(now=start + timedelta(milliseconds=6), send=sent.extend).runs == 0
    assert JobRun.objects.filter(job=job).count() == 1


def test_a_slot_that_already_has_a_run_is_never_run_twice(acme, make_job) -> None:
    """GIVEN a dispatcher that reads a stale next_fire_at (e.g. the job row restored from a backup)
    WHEN it dispatches the same slot again THEN the unique constraint keeps the one run."""
    start = utc(2026, 5, 4, 12, 0, 0)
    job = make_job(acme, "stale", interval_s=1, start_at=start)
    set_next(job, start)
    dispatch_once(now=start + timedelta(seconds=2.5), send=lambda t: None)
    set_next(job, start)  # rewind
    again = dispatch_once(now=start + timedelta(seconds=2.5), send=lambda t: None)
    assert again.conflicts == 3 and again.runs == 0
    assert slots(job) == [start, start + timedelta(seconds=1), start + timedelta(seconds=2)]


def test_paused_jobs_do_not_fire(acme, make_job) -> None:
    job = make_job(acme, "paused", interval_s=1, enabled=False)
    assert job.next_fire_at is None
    assert dispatch_once(now=datetime.now(UTC) + timedelta(hours=1), send=lambda t: None).jobs == 0


def test_skip_policy_records_the_misfire_without_running_it(acme, make_job) -> None:
    start = utc(2026, 5, 4, 12, 0, 0)
    job = make_job(acme, "skipper", interval_s=1, start_at=start, misfire_policy="skip", misfire_grace_s=2)
    set_next(job, start)
    result = dispatch_once(now=start + timedelta(seconds=10.2), send=lambda t: None)
    pending = slots(job, status="pending")
    assert pending == [start + timedelta(seconds=9), start + timedelta(seconds=10)]  # within 2 s of now
    skipped = JobRun.objects.get(job=job, status="skipped")
    assert skipped.scheduled_for == start + timedelta(seconds=8) and skipped.missed_since == start
    assert "misfire policy skip" in skipped.error
    assert len(result.tickets) == 2  # the skipped record is never sent to a worker


def test_run_once_policy_adds_one_catch_up_run(acme, make_job) -> None:
    start = utc(2026, 5, 4, 12, 0, 0)
    job = make_job(acme, "catcher", interval_s=1, start_at=start, misfire_policy="run_once", misfire_grace_s=2)
    set_next(job, start)
    result = dispatch_once(now=start + timedelta(seconds=10.2), send=lambda t: None)
    assert result.catch_up == 1 and result.runs == 3
    catch_up = JobRun.objects.get(job=job, trigger="catch_up")
    assert catch_up.scheduled_for == start + timedelta(seconds=8) and catch_up.missed_since == start


def test_jobs_with_the_same_schedule_each_get_their_run(acme, make_job) -> None:
    start = utc(2026, 5, 4, 12, 0, 0)
    jobs = [make_job(acme, f"same-{n}", schedule_type="cron", cron="0 12 * * *") for n in range(30)]
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(next_fire_at=start)
    result = dispatch_due(now=start + timedelta(seconds=0.3), batch_size=7, send=lambda t: None)
    assert result.runs == 30
    assert JobRun.objects.filter(job__in=jobs, scheduled_for=start).count() == 30
    assert set(Job.objects.filter(pk__in=[j.pk for j in jobs]).values_list("next_fire_at", flat=True)) == {
        start + timedelta(days=1)}


def test_a_one_off_job_fires_once(acme, make_job) -> None:
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(minutes=5)
    job = make_job(acme, "once", schedule_type="once", run_at=when)
    assert job.next_fire_at == when
    dispatch_once(now=when + timedelta(seconds=0.2), send=lambda t: None)
    dispatch_once(now=when + timedelta(seconds=30), send=lambda t: None)
    assert slots(job) == [when]
    job.refresh_from_db()
    assert job.next_fire_at is None


# --- DST through the dispatcher, with a fake clock ----------------------------------------------


def _night(job: Job, start: datetime, hours: int, step: timedelta) -> list[datetime]:
    set_next(job, planning.first_fire_at(job.schedule(), now=start))
    now = start
    while now <= start + timedelta(hours=hours):
        dispatch_once(now=now, send=lambda t: None)
        now += step
    return slots(job)


def test_berlin_daily_0230_on_the_spring_forward_night_runs_once_at_0300_cest(acme, make_job) -> None:
    job = make_job(acme, "berlin-spring", schedule_type="cron", cron="30 2 * * *", timezone="Europe/Berlin")
    ran = _night(job, utc(2026, 3, 28, 20, 0), 12, timedelta(minutes=1))
    assert ran == [utc(2026, 3, 29, 1, 0)]


def test_berlin_daily_0230_on_the_fall_back_night_runs_once_at_the_first_0230(acme, make_job) -> None:
    job = make_job(acme, "berlin-autumn", schedule_type="cron", cron="30 2 * * *", timezone="Europe/Berlin")
    ran = _night(job, utc(2026, 10, 24, 20, 0), 12, timedelta(minutes=1))
    assert ran == [utc(2026, 10, 25, 0, 30)]
    job.refresh_from_db()
    assert job.next_fire_at == utc(2026, 10, 26, 1, 30)  # 02:30 CET the next day
