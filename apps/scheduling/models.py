"""Scheduled jobs and their runs.

A `JobRun` is unique on (job, scheduled_for): that constraint, not any lock, is what makes
a slot run at most once, whichever dispatcher (or how many of them) saw it first. Slots
from a schedule are whole UTC seconds; a manual "run now" uses the current instant with
its microseconds (never a whole second), so it can never take a schedule slot's place.
"""

from __future__ import annotations

from datetime import datetime

from django.db import models
from django.db.models import Q

from apps.core.tenancy import TenantQuerySet
from apps.scheduling import cron


class Job(models.Model):
    class ScheduleType(models.TextChoices):
        CRON = "cron"
        INTERVAL = "interval"
        ONCE = "once"

    class MisfirePolicy(models.TextChoices):
        # Slots missed by more than misfire_grace_s (dispatchers down): dropped, or one catch-up run.
        SKIP = "skip"
        RUN_ONCE = "run_once"

    class ConcurrencyPolicy(models.TextChoices):
        # What a run does when another run of the same job is still running (Kubernetes CronJob).
        ALLOW = "allow"
        FORBID = "forbid"
        REPLACE = "replace"

    TENANT_PATH = "org"

    org = models.ForeignKey("accounts.Organization", on_delete=models.CASCADE, related_name="jobs")
    name = models.SlugField(max_length=63)
    kind = models.CharField(max_length=32)
    params = models.JSONField(default=dict, blank=True)

    schedule_type = models.CharField(max_length=8, choices=ScheduleType.choices)
    cron = models.CharField(max_length=120, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    interval_s = models.PositiveIntegerField(null=True, blank=True)
    # interval: the first slot (every slot is start_at + k * interval_s); cron: no slot before it.
    start_at = models.DateTimeField(null=True, blank=True)
    run_at = models.DateTimeField(null=True, blank=True)  # one-off
    end_at = models.DateTimeField(null=True, blank=True)  # no slot after it

    misfire_policy = models.CharField(max_length=8, choices=MisfirePolicy.choices,
                                      default=MisfirePolicy.RUN_ONCE)
    misfire_grace_s = models.PositiveIntegerField(default=60)
    concurrency_policy = models.CharField(max_length=8, choices=ConcurrencyPolicy.choices,
                                          default=ConcurrencyPolicy.FORBID)
    max_retries = models.PositiveIntegerField(default=0)
    retry_backoff_s = models.PositiveIntegerField(default=30)
    timeout_s = models.PositiveIntegerField(default=600)
    enabled = models.BooleanField(default=True)

    webhook_url = models.CharField(max_length=2048, blank=True)
    webhook_secret_encrypted = models.TextField(blank=True)  # Fernet, see apps.core.crypto

    # The earliest slot not yet handed to a run; NULL = nothing left to fire (paused, ended, one-off done).
    next_fire_at = models.DateTimeField(null=True, blank=True)  # indexed by job_due_idx (enabled jobs)
    last_status = models.CharField(max_length=16, blank=True)
    last_run_at = models.DateTimeField(null=True, blank=True)
    created_by = models.CharField(max_length=64, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # What the audit log keeps (apps.audit.services.audit_snapshot): everything but the webhook secret.
    audit_fields = ("name", "kind", "params", "schedule_type", "cron", "timezone", "interval_s", "start_at",
                    "run_at", "end_at", "misfire_policy", "misfire_grace_s", "concurrency_policy", "max_retries",
                    "retry_backoff_s", "timeout_s", "enabled", "webhook_url", "org")

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["org", "name"], name="job_unique_name"),
            models.CheckConstraint(
                condition=(Q(schedule_type="cron") & ~Q(cron=""))
                | (Q(schedule_type="interval") & Q(interval_s__gte=1) & Q(start_at__isnull=False))
                | (Q(schedule_type="once") & Q(run_at__isnull=False)),
                name="job_schedule_complete",
            ),
        ]
        indexes = [
            # The dispatcher's only query: enabled jobs whose next slot has come.
            models.Index(fields=["next_fire_at"], condition=Q(enabled=True), name="job_due_idx"),
        ]
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def audit_extra(self) -> dict:
        return {"webhook_secret_set": bool(self.webhook_secret_encrypted)}

    def description(self) -> str:
        """The schedule in words, for people: "At 02:30 AM, Europe/Berlin (paused)"."""
        try:
            text = cron.describe(self.schedule())
        except cron.ScheduleError as exc:
            return f"invalid schedule: {exc.message}"
        if self.end_at is not None:
            text += f", until {self.end_at:%Y-%m-%d %H:%M:%S} UTC"
        return text if self.enabled else f"{text} (paused)"

    def schedule(self) -> cron.Schedule:
        """The pure schedule object (raises cron.ScheduleError if the row is inconsistent)."""
        return schedule_from_fields(
            schedule_type=self.schedule_type, cron_expr=self.cron, timezone=self.timezone,
            interval_s=self.interval_s, start_at=self.start_at, run_at=self.run_at,
        )


def schedule_from_fields(*, schedule_type: str, cron_expr: str = "", timezone: str = "UTC",
                         interval_s: int | None = None, start_at: datetime | None = None,
                         run_at: datetime | None = None) -> cron.Schedule:
    if schedule_type == Job.ScheduleType.CRON:
        return cron.CronSchedule(cron_expr, timezone or "UTC")
    if schedule_type == Job.ScheduleType.INTERVAL:
        if interval_s is None:
            raise cron.ScheduleError("invalid_interval", "an interval schedule needs interval_s (seconds)")
        if start_at is None:
            raise cron.ScheduleError("invalid_schedule", "an interval schedule needs start_at")
        return cron.IntervalSchedule(interval_s, start_at)
    if schedule_type == Job.ScheduleType.ONCE:
        if run_at is None:
            raise cron.ScheduleError("invalid_schedule", "a one-off schedule needs run_at")
        return cron.OneOffSchedule(run_at)
    raise cron.ScheduleError("invalid_schedule", f"unknown schedule type {schedule_type!r}")


class JobRun(models.Model):
    class Status(models.TextChoices):
        PENDING = "pending"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        SKIPPED = "skipped"
        TIMED_OUT = "timed_out"
        CANCELLED = "cancelled"

    class Trigger(models.TextChoices):
        SCHEDULE = "schedule"
        CATCH_UP = "catch_up"  # one run standing for slots missed while no dispatcher ran
        MANUAL = "manual"

    FINAL = frozenset({Status.SUCCEEDED, Status.FAILED, Status.SKIPPED, Status.TIMED_OUT, Status.CANCELLED})

    TENANT_PATH = "job__org"

    # No separate index on job: the unique (job, scheduled_for) index serves every lookup by job,
    # and newest-first history too (a B-tree reads backwards). Fewer indexes, cheaper run updates.
    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="runs", db_index=False)
    scheduled_for = models.DateTimeField()
    trigger = models.CharField(max_length=8, choices=Trigger.choices, default=Trigger.SCHEDULE)
    # Set when this run follows a misfire: the first slot that was missed.
    missed_since = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=10, choices=Status.choices, default=Status.PENDING)
    # Retries reuse this row: attempt counts up, earlier attempts are summarised in `attempts`.
    attempt = models.PositiveIntegerField(default=1)
    max_attempts = models.PositiveIntegerField(default=1)
    attempts = models.JSONField(default=list, blank=True)
    not_before = models.DateTimeField(null=True, blank=True)  # a retry waits for its backoff
    # When its message left for the workers; NULL from the commit that made it pending until the send is
    # confirmed, so a run whose sender died in between is found and sent again within seconds (runner.reap).
    enqueued_at = models.DateTimeField(null=True, blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    deadline_at = models.DateTimeField(null=True, blank=True)  # started_at + the job's timeout
    duration_ms = models.PositiveIntegerField(null=True, blank=True)
    output = models.JSONField(null=True, blank=True)
    error = models.TextField(blank=True)
    worker = models.CharField(max_length=200, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    webhook_status = models.CharField(max_length=200, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    objects = TenantQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["job", "scheduled_for"], name="jobrun_unique_slot"),
        ]
        indexes = [
            # The reaper's queries: live runs only, so the index stays small. heartbeat_at is left out
            # so a heartbeat (every 2 s per running run) can be a HOT update that touches no index.
            models.Index(fields=["status"], condition=Q(status__in=["pending", "running"]),
                         name="jobrun_live_idx"),
        ]
        ordering = ["-scheduled_for"]

    def __str__(self) -> str:
        return f"{self.job_id}@{self.scheduled_for:%Y-%m-%dT%H:%M:%S}"
