"""The dispatcher: turn due slots into JobRun rows, exactly once, and hand them to workers.

One tick (`dispatch_once`), repeated until nothing is due:

1. ``SELECT ... FROM job WHERE enabled AND next_fire_at <= now FOR UPDATE SKIP LOCKED LIMIT n``.
   A second dispatcher running at the same moment skips the rows the first holds and takes
   the next batch, so an active and a standby dispatcher share the work instead of
   blocking each other or doing it twice.
2. For each job the pure planner (`planning.plan_due`) lists the slots to run and where the
   schedule resumes, applying the misfire policy.
3. ``INSERT ... ON CONFLICT (job_id, scheduled_for) DO NOTHING RETURNING id``: the unique
   constraint is the last word on "this slot already has a run" (say, a dispatcher that
   read an old next_fire_at before a restore from backup).
4. next_fire_at advances in the same transaction; the run messages go out on commit, and
   the runs' enqueued_at is set once the broker took them.

If a dispatcher dies between commit and send, its runs stay pending with no enqueued_at, and
any dispatcher's reaper sends them within seconds; the workers' conditional claim makes a
doubled message harmless.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.utils import timezone

from apps.scheduling import cron, pgsql, planning, registry
from apps.scheduling.models import Job, JobRun, schedule_from_fields
from apps.scheduling.runner import Ticket, enqueue_on_commit

log = logging.getLogger(__name__)

DEFAULT_BATCH = 200
FIRST_BATCH = 25  # a burst starts small so the first runs go out at once, then batches double
_JOB_FIELDS = ("id", "kind", "params", "schedule_type", "cron", "timezone", "interval_s", "start_at", "run_at",
               "end_at", "misfire_policy", "misfire_grace_s", "max_retries", "timeout_s", "next_fire_at")


@dataclass
class TickResult:
    jobs: int = 0
    runs: int = 0  # pending runs created (on time and catch-up)
    catch_up: int = 0
    skipped: int = 0  # misfires recorded as a skipped run (policy skip)
    conflicts: int = 0  # slots that already had a run (the unique constraint held)
    tickets: list[Ticket] = field(default_factory=list)

    def add(self, other: TickResult) -> None:
        self.jobs += other.jobs
        self.runs += other.runs
        self.catch_up += other.catch_up
        self.skipped += other.skipped
        self.conflicts += other.conflicts
        self.tickets += other.tickets


@dataclass(frozen=True)
class _Row:
    job_id: int
    scheduled_for: datetime
    trigger: str
    status: str
    max_attempts: int
    missed_since: datetime | None = None
    error: str = ""


def dispatch_once(*, now: datetime | None = None, batch_size: int = DEFAULT_BATCH,
                  send: Callable[[list[Ticket]], Any] | None = None,
                  plans: dict[tuple[Any, ...], planning.Plan] | None = None) -> TickResult:
    """One batch: claim due jobs, create their runs, advance them. `now` and `send` are injectable
    (tests drive DST nights with a fake clock; `send` defaults to the Celery queue)."""
    now = now or timezone.now()
    plans = {} if plans is None else plans
    result = TickResult()
    with transaction.atomic():
        jobs = list(Job.objects.select_for_update(skip_locked=True)
                    .filter(enabled=True, next_fire_at__lte=now)
                    .order_by("next_fire_at").only(*_JOB_FIELDS)[:batch_size])
        if not jobs:
            return result
        rows: list[_Row] = []
        advanced: dict[datetime | None, list[int]] = {}
        for job in jobs:
            plan = _plan(job, now, plans)
            if plan is None:
                continue
            rows += _rows_for(job, plan)
            advanced.setdefault(plan.next_fire_at, []).append(job.pk)
        # Stamped with the insert's own moment, not the burst's planning instant: a reaper judges an unsent run
        # by its created_at, and a later batch of a long burst is seconds younger than the tick that planned it.
        created = _insert(rows, timezone.now())
        _advance(advanced)
        result.jobs = len(jobs)
        by_id = {job.pk: job for job in jobs}
        for run_id, job_id, status, trigger in created:
            if status == JobRun.Status.SKIPPED:
                result.skipped += 1
                continue
            result.runs += 1
            result.catch_up += trigger == JobRun.Trigger.CATCH_UP
            job = by_id[job_id]
            result.tickets.append(Ticket(run_id, job.timeout_s, quick=registry.is_quick(job.kind, job.params)))
        result.conflicts = len(rows) - len(created)
        enqueue_on_commit(result.tickets, send)
    if result.conflicts:
        log.warning("dispatcher: %d slot(s) already had a run; the unique constraint kept them single",
                    result.conflicts)
    return result


def dispatch_due(*, now: datetime | None = None, batch_size: int = DEFAULT_BATCH,
                 send: Callable[[list[Ticket]], Any] | None = None, max_batches: int = 50) -> TickResult:
    """Batches until nothing claimable is due. Each batch commits (and its runs start) on its own,
    so workers begin on the first jobs while the dispatcher plans the next ones."""
    total = TickResult()
    now = now or timezone.now()
    plans: dict[tuple[Any, ...], planning.Plan] = {}
    size = min(FIRST_BATCH, batch_size)
    for _ in range(max_batches):
        batch = dispatch_once(now=now, batch_size=size, send=send, plans=plans)
        total.add(batch)
        if batch.jobs < size:
            break
        size = min(size * 2, batch_size)
    return total


def warm_upcoming(*, now: datetime | None = None, within_s: float = 2.0, limit: int = 5000) -> int:
    """Between ticks: evaluate the schedules of jobs about to fire, so the tick itself only writes."""
    now = now or timezone.now()
    upcoming = Job.objects.filter(enabled=True, next_fire_at__gt=now,
                                  next_fire_at__lte=now + timedelta(seconds=within_s))
    rows = (upcoming.order_by()  # no ORDER BY: DISTINCT must not include the default ordering column
            .values_list("schedule_type", "cron", "timezone", "interval_s", "start_at", "run_at", "next_fire_at")
            .distinct()[:limit])
    warmed = 0
    for schedule_type, cron_expr, tz, interval_s, start_at, run_at, next_fire_at in rows:
        try:
            schedule = schedule_from_fields(schedule_type=schedule_type, cron_expr=cron_expr, timezone=tz,
                                            interval_s=interval_s, start_at=start_at, run_at=run_at)
        except cron.ScheduleError:
            continue
        planning.warm(schedule, next_fire_at)
        warmed += 1
    return warmed


def due_unclaimed(now: datetime | None = None) -> bool:
    """Are due jobs left (held by another dispatcher or a worker's brief lock)?"""
    return Job.objects.filter(enabled=True, next_fire_at__lte=now or timezone.now()).exists()


def _plan(job: Job, now: datetime, cache: dict[tuple[Any, ...], planning.Plan]) -> planning.Plan | None:
    # Jobs sharing a schedule and state share a plan: a thousand "0 2 * * *" jobs cost one evaluation.
    key = (job.schedule_type, job.cron, job.timezone, job.interval_s, job.start_at, job.run_at, job.end_at,
           job.next_fire_at, job.misfire_grace_s, job.misfire_policy)
    plan = cache.get(key)
    if plan is not None:
        return plan
    try:
        plan = planning.plan_due(job.schedule(), next_fire_at=job.next_fire_at, now=now,
                                 grace_s=job.misfire_grace_s, misfire_policy=job.misfire_policy,
                                 end_at=job.end_at)
    except cron.ScheduleError as exc:
        # Only reachable if the row was edited behind the services' back: stop it, say why.
        log.error("job %s has an invalid schedule (%s); it will not fire", job.pk, exc.message)
        job.next_fire_at = None
        Job.objects.filter(pk=job.pk).update(next_fire_at=None, last_status="invalid")
        return None
    cache[key] = plan
    return plan


def _advance(advanced: dict[datetime | None, list[int]]) -> None:
    if connection.vendor == "postgresql":
        pgsql.advance_jobs({job_id: slot for slot, job_ids in advanced.items() for job_id in job_ids})
        return
    # Jobs on the same schedule move to the same next slot: one UPDATE per distinct slot.
    for next_fire_at, job_ids in advanced.items():
        Job.objects.filter(pk__in=job_ids).update(next_fire_at=next_fire_at)


def _rows_for(job: Job, plan: planning.Plan) -> list[_Row]:
    attempts = job.max_retries + 1
    rows: list[_Row] = []
    missed = plan.missed
    if missed is not None and plan.catch_up is not None:
        rows.append(_Row(job.pk, plan.catch_up, JobRun.Trigger.CATCH_UP, JobRun.Status.PENDING, attempts,
                         missed_since=missed.first))
    elif missed is not None:
        rows.append(_Row(job.pk, missed.last, JobRun.Trigger.SCHEDULE, JobRun.Status.SKIPPED, attempts,
                         missed_since=missed.first,
                         error=f"missed: no dispatcher ran from {missed.first:%Y-%m-%d %H:%M:%S} to "
                               f"{missed.last:%Y-%m-%d %H:%M:%S} UTC; not run (misfire policy skip)"))
    for slot in plan.run_slots:
        rows.append(_Row(job.pk, slot, JobRun.Trigger.SCHEDULE, JobRun.Status.PENDING, attempts))
    return rows


def _insert(rows: list[_Row], now: datetime) -> list[tuple[int, int, str, str]]:
    """Insert runs, silently keeping any slot that already has one; returns what was inserted."""
    if not rows:
        return []
    if connection.vendor == "postgresql":
        return pgsql.insert_runs(rows, now)
    return _insert_values(rows, now)


def _insert_values(rows: list[_Row], now: datetime) -> list[tuple[int, int, str, str]]:
    """Portable form (SQLite, the zero-setup default): INSERT ... VALUES (...), (...) ON CONFLICT."""
    ops = connection.ops
    columns = ("job_id", "scheduled_for", "trigger", "missed_since", "status", "attempt", "max_attempts",
               "attempts", "enqueued_at", "finished_at", "error", "worker", "webhook_status", "created_at")
    placeholder = "(" + ", ".join(["%s"] * len(columns)) + ")"
    params: list[Any] = []
    for row in rows:
        final = row.status == JobRun.Status.SKIPPED
        params += [row.job_id, ops.adapt_datetimefield_value(row.scheduled_for), row.trigger,
                   ops.adapt_datetimefield_value(row.missed_since), row.status, 1, row.max_attempts,
                   json.dumps([]), None,
                   ops.adapt_datetimefield_value(now) if final else None, row.error, "", "",
                   ops.adapt_datetimefield_value(now)]
    table = ops.quote_name(JobRun._meta.db_table)
    names = ", ".join(ops.quote_name(c) for c in columns)
    # Only quoted identifiers and %s placeholders are interpolated; every value is a parameter.
    sql = (f"INSERT INTO {table} ({names}) VALUES {', '.join([placeholder] * len(rows))} "  # noqa: S608
           f"ON CONFLICT (job_id, scheduled_for) DO NOTHING "
           f"RETURNING id, job_id, status, {ops.quote_name('trigger')}")
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        return [tuple(r) for r in cursor.fetchall()]  # type: ignore[misc]
