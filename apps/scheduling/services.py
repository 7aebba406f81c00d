"""Writes for scheduled jobs: save, pause, resume, run now, cancel, delete. Each writes its audit event."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.audit.services import audit_record, audit_snapshot
from apps.core import crypto, webhooks
from apps.core.errors import Conflict, DomainError, save_or_conflict
from apps.scheduling import cron, planning, registry
from apps.scheduling.models import Job, JobRun
from apps.scheduling.runner import Ticket, enqueue_on_commit

RUN_RETENTION_DAYS = 30  # finished runs older than this are pruned (an every-second job writes 86,400 a day)
SCHEDULE_FIELDS = ("schedule_type", "cron", "timezone", "interval_s", "start_at", "run_at", "end_at")
MIN_WEBHOOK_SECRET_LEN = 16


def schedule_error(exc: cron.ScheduleError) -> DomainError:
    field = {"invalid_cron": "cron", "invalid_timezone": "timezone", "interval_too_short": "interval_s",
             "invalid_interval": "interval_s"}.get(exc.code, "schedule_type")
    return DomainError(exc.code, exc.message, field=field)


def _check(job: Job, *, now: datetime, creating: bool) -> cron.Schedule:
    if job.schedule_type == Job.ScheduleType.INTERVAL and job.start_at is None:
        job.start_at = now.replace(microsecond=0)
    try:
        schedule = job.schedule()
    except cron.ScheduleError as exc:
        raise schedule_error(exc) from None
    if job.schedule_type == Job.ScheduleType.ONCE and creating and job.run_at < now - timedelta(seconds=1):
        raise DomainError("run_at_in_past", "A one-off job must run now or later.", field="run_at")
    if job.end_at is not None and job.start_at is not None and job.end_at <= job.start_at:
        raise DomainError("invalid_schedule", "end_at must be after start_at.", field="end_at")
    if job.webhook_url:
        try:
            webhooks.parse_url(job.webhook_url, registry.url_policy(job.org))
        except webhooks.UnsafeUrl as exc:
            raise DomainError(exc.code, exc.message, field="webhook_url") from None
        if not job.webhook_secret_encrypted:
            raise DomainError(
                "webhook_secret_required",
                f"A webhook needs a signing secret of at least {MIN_WEBHOOK_SECRET_LEN} characters.",
                field="webhook_secret")
    job.params = registry.validate_params(job.kind, job.params, registry.job_principal(job))
    return schedule


def job_save(*, principal: Principal | None, job: Job, data: dict[str, Any],
             webhook_secret: str | None = None) -> Job:
    """Create or update a job. A changed schedule (or a new job) starts firing from now, not from the past."""
    now = timezone.now()
    creating = job.pk is None
    with transaction.atomic():
        if not creating:
            # Lock against the dispatcher so next_fire_at is not advanced under the new schedule.
            Job.objects.select_for_update().filter(pk=job.pk).values_list("pk").first()
        before = None if creating else audit_snapshot(Job.objects.get(pk=job.pk))
        old_schedule = None if creating else {f: getattr(job, f) for f in (*SCHEDULE_FIELDS, "enabled")}
        for field, value in data.items():
            setattr(job, field, value)
        if webhook_secret is not None:
            if webhook_secret and len(webhook_secret) < MIN_WEBHOOK_SECRET_LEN:
                raise DomainError("webhook_secret_too_short",
                                  f"The signing secret needs at least {MIN_WEBHOOK_SECRET_LEN} characters.",
                                  field="webhook_secret")
            job.webhook_secret_encrypted = crypto.encrypt(webhook_secret)
        if not job.webhook_url:
            job.webhook_secret_encrypted = ""
        _clear_other_schedule_fields(job)
        schedule = _check(job, now=now, creating=creating)
        new_schedule = {f: getattr(job, f) for f in (*SCHEDULE_FIELDS, "enabled")}
        if creating or new_schedule != old_schedule:
            job.next_fire_at = _first_fire(job, schedule, now) if job.enabled else None
        # The job acts on its creator's authority (registry.creator_authority_lapsed): whoever enables a paused
        # job takes it over, so a job paused because its creator's token lapsed runs again on theirs.
        if principal is not None and (creating or (job.enabled and not old_schedule["enabled"])):
            job.created_by = principal.actor
        save_or_conflict(job, Conflict("name_taken", f"A job named '{job.name}' already exists in this organization.",
                                       field="name"))
        audit_record(principal=principal, org=job.org, action="job.create" if creating else "job.update",
                     obj=job, before=before, after=audit_snapshot(job))
    return job


def _clear_other_schedule_fields(job: Job) -> None:
    # A job switched from cron to interval keeps no stale cron text that would confuse a reader.
    if job.schedule_type != Job.ScheduleType.CRON:
        job.cron = ""
    if job.schedule_type != Job.ScheduleType.INTERVAL:
        job.interval_s = None
    if job.schedule_type != Job.ScheduleType.ONCE:
        job.run_at = None
    else:
        job.start_at = None


def _first_fire(job: Job, schedule: cron.Schedule, now: datetime) -> datetime | None:
    return planning.first_fire_at(schedule, now=now, start_at=job.start_at, end_at=job.end_at)


def job_pause(*, principal: Principal | None, job: Job) -> Job:
    """Stop firing; runs already waiting for a worker are cancelled (a running one finishes)."""
    now = timezone.now()
    with transaction.atomic():
        Job.objects.select_for_update().filter(pk=job.pk).update(enabled=False, next_fire_at=None)
        cancelled = JobRun.objects.filter(job=job, status=JobRun.Status.PENDING).update(
            status=JobRun.Status.CANCELLED, finished_at=now, error="cancelled: the job was paused")
        job.refresh_from_db()
        audit_record(principal=principal, org=job.org, action="job.pause", obj=job,
                     after={"enabled": False, "cancelled_pending_runs": cancelled})
    return job


def jobs_stop_for(org, actors: set[str], principal: Principal | None) -> int:
    """Pause the org's jobs made (or last taken over) by a member who left (apps.core.lifecycle)."""
    jobs = list(Job.objects.filter(org=org, created_by__in=actors, enabled=True))
    for job in jobs:
        job_pause(principal=principal, job=job)
    return len(jobs)


def job_resume(*, principal: Principal | None, job: Job) -> Job:
    """Fire again from now on: slots that passed while paused are not misfires and do not run."""
    now = timezone.now()
    with transaction.atomic():
        job = Job.objects.select_for_update().select_related("org").get(pk=job.pk)
        try:
            schedule = job.schedule()
        except cron.ScheduleError as exc:
            raise schedule_error(exc) from None
        job.enabled = True
        job.next_fire_at = _first_fire(job, schedule, now)
        fields = ["enabled", "next_fire_at", "updated_at"]
        if principal is not None:  # whoever resumes it takes it over (registry.creator_authority_lapsed)
            job.created_by = principal.actor
            fields.append("created_by")
        job.save(update_fields=fields)
        audit_record(principal=principal, org=job.org, action="job.resume", obj=job,
                     after={"enabled": True, "next_fire_at": job.next_fire_at})
    return job


def job_delete(*, principal: Principal | None, job: Job) -> None:
    with transaction.atomic():
        audit_record(principal=principal, org=job.org, action="job.delete", obj=job, before=audit_snapshot(job))
        # Running runs go with the job; their late outcome updates nothing (conditional writes).
        job.delete()


def job_run_now(*, principal: Principal | None, job: Job) -> JobRun:
    """A manual run, outside the schedule (allowed while paused). It takes no schedule slot:
    its scheduled_for carries microseconds, schedule slots never do."""
    now = timezone.now()
    if now.microsecond == 0:
        now = now.replace(microsecond=1)
    with transaction.atomic():
        run = JobRun(job=job, scheduled_for=now, trigger=JobRun.Trigger.MANUAL,
                     max_attempts=job.max_retries + 1)
        save_or_conflict(run, Conflict("run_exists", "A run of this job was just requested; try again."))
        audit_record(principal=principal, org=job.org, action="job.run", obj=job,
                     after={"run": run.pk, "scheduled_for": now})
        enqueue_on_commit([Ticket(run.pk, job.timeout_s)])
    return run


def run_cancel(*, principal: Principal | None, run: JobRun) -> JobRun:
    """Cancel a pending or running run. A running executor is told to stop at its next check;
    whatever it returns afterwards is discarded."""
    now = timezone.now()
    with transaction.atomic():
        live = [JobRun.Status.PENDING, JobRun.Status.RUNNING]
        changed = JobRun.objects.filter(pk=run.pk, status__in=live).update(
            status=JobRun.Status.CANCELLED, finished_at=now,
            error=f"cancelled by {principal.actor if principal else 'system'}")
        run.refresh_from_db()
        if not changed:
            raise Conflict("run_finished", f"The run already finished ({run.status}).")
        audit_record(principal=principal, org=run.job.org, action="jobrun.cancel", obj=run,
                     after={"status": run.status})
    return run


def run_history_prune(*, older_than_days: int = RUN_RETENTION_DAYS, batch: int = 5000, max_batches: int = 100) -> int:
    """Delete finished runs older than the retention, in batches (short transactions). Their slots are
    long past every job's next_fire_at, so no dispatcher will ask for them again."""
    cutoff = timezone.now() - timedelta(days=older_than_days)
    removed = 0
    for _ in range(max_batches):
        ids = list(JobRun.objects.filter(scheduled_for__lt=cutoff, status__in=list(JobRun.FINAL))
                   .values_list("pk", flat=True)[:batch])
        if not ids:
            break
        removed += JobRun.objects.filter(pk__in=ids).delete()[0]
    return removed
