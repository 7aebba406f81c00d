"""Scheduling API serializers: shapes and ranges at the edge; schedule and kind rules live in services."""

from __future__ import annotations

from typing import Any

from django.utils import timezone
from rest_framework import serializers

from apps.accounts.models import Organization
from apps.core.api.fields import ScopedSlugRelatedField, SlugNameField, TenantModelSerializer
from apps.scheduling import cron as schedules
from apps.scheduling import planning, registry, selectors
from apps.scheduling.models import Job, JobRun

# Fields whose value changes without anyone editing the job (the dispatcher moves them on);
# they are left out of the ETag so a client's If-Match does not go stale every second.
VOLATILE_FIELDS = ("next_fire_at", "next_fire_times", "last_status", "last_run_at")


class JobSerializer(TenantModelSerializer):
    org = ScopedSlugRelatedField(Organization, required=False)
    name = SlugNameField()
    kind = serializers.ChoiceField(choices=[])
    params = serializers.JSONField(required=False)
    cron = serializers.CharField(max_length=120, required=False, allow_blank=True)
    timezone = serializers.CharField(max_length=64, required=False)
    interval_s = serializers.IntegerField(min_value=schedules.MIN_INTERVAL_S, max_value=366 * 86400, required=False,
                                         allow_null=True)
    # At least 1 s: with 0, a tick a few ms after the slot would already count as a misfire.
    misfire_grace_s = serializers.IntegerField(min_value=1, max_value=7 * 86400, required=False)
    max_retries = serializers.IntegerField(min_value=0, max_value=20, required=False)
    retry_backoff_s = serializers.IntegerField(min_value=0, max_value=86400, required=False)
    timeout_s = serializers.IntegerField(min_value=1, max_value=7 * 86400, required=False)
    webhook_url = serializers.CharField(max_length=2048, required=False, allow_blank=True)
    webhook_secret = serializers.CharField(max_length=256, required=False, allow_blank=True, write_only=True,
                                           trim_whitespace=False,
                                           help_text="HMAC-SHA256 signing key for the failure webhook; never shown.")
    webhook_secret_set = serializers.SerializerMethodField()
    description = serializers.SerializerMethodField()
    next_fire_times = serializers.SerializerMethodField()

    class Meta:
        model = Job
        fields = ["id", "org", "name", "kind", "params", "schedule_type", "cron", "timezone", "interval_s",
                  "start_at", "run_at", "end_at", "misfire_policy", "misfire_grace_s", "concurrency_policy",
                  "max_retries", "retry_backoff_s", "timeout_s", "enabled", "webhook_url", "webhook_secret",
                  "webhook_secret_set", "description", "next_fire_at", "next_fire_times", "last_status",
                  "last_run_at", "created_by", "created_at", "updated_at"]
        read_only_fields = ["next_fire_at", "last_status", "last_run_at", "created_by", "created_at", "updated_at"]
        validators: list = []  # name uniqueness per org: the service answers 409 name_taken

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fields["kind"].choices = registry.kind_choices()  # kinds register at import time

    def validate_org(self, org: Organization) -> Organization:
        principal = self.context["request"].principal
        if self.instance is not None and org.pk != self.instance.org_id:
            raise serializers.ValidationError("A job cannot move to another organization.")
        if not principal.is_operator and org.pk != principal.org_id:
            raise serializers.ValidationError("You can only create jobs for your own organization.")
        return org

    def validate(self, attrs: dict[str, Any]) -> dict[str, Any]:
        attrs = super().validate(attrs)
        if self.instance is None:
            attrs.setdefault("org", self.context["request"].principal.org)
            attrs.setdefault("params", {})
        return attrs

    def get_webhook_secret_set(self, job: Job) -> bool:
        return bool(job.webhook_secret_encrypted)

    def get_description(self, job: Job) -> str:
        return job.description()

    def get_next_fire_times(self, job: Job) -> list[str]:
        return [_iso(slot) for slot in selectors.job_upcoming(job=job)]


def _iso(moment) -> str:
    """The same text DRF gives every other datetime in the API (``...Z``)."""
    return serializers.DateTimeField().to_representation(moment)


class SchedulePreviewSerializer(serializers.Serializer):
    """What the create/edit form sends while a person types; answers description and next five times."""

    schedule_type = serializers.ChoiceField(choices=Job.ScheduleType.choices)
    cron = serializers.CharField(max_length=120, required=False, allow_blank=True, default="")
    timezone = serializers.CharField(max_length=64, required=False, default="UTC")
    interval_s = serializers.IntegerField(required=False, allow_null=True, default=None)
    start_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    run_at = serializers.DateTimeField(required=False, allow_null=True, default=None)
    end_at = serializers.DateTimeField(required=False, allow_null=True, default=None)


def schedule_preview(data: dict[str, Any], *, count: int = 5) -> dict[str, Any]:
    """{"description", "next_fire_times"} or {"code", "detail"} for a schedule that cannot fire."""
    from apps.scheduling.models import schedule_from_fields

    now = timezone.now()
    start_at = data.get("start_at")
    if data["schedule_type"] == Job.ScheduleType.INTERVAL and start_at is None:
        start_at = now.replace(microsecond=0)
    try:
        schedule = schedule_from_fields(schedule_type=data["schedule_type"], cron_expr=data.get("cron") or "",
                                        timezone=data.get("timezone") or "UTC", interval_s=data.get("interval_s"),
                                        start_at=start_at, run_at=data.get("run_at"))
        first = planning.first_fire_at(schedule, now=now, start_at=start_at, end_at=data.get("end_at"))
        slots = planning.upcoming(schedule, first=first, count=count, end_at=data.get("end_at"))
        return {"description": schedules.describe(schedule), "next_fire_times": [_iso(s) for s in slots],
                "timezone": data.get("timezone") or "UTC"}
    except schedules.ScheduleError as exc:
        return {"code": exc.code, "detail": exc.message}


class JobRunSerializer(TenantModelSerializer):
    job_name = serializers.CharField(source="job.name", read_only=True)
    lateness_ms = serializers.SerializerMethodField()

    class Meta:
        model = JobRun
        fields = ["id", "job", "job_name", "scheduled_for", "trigger", "missed_since", "status", "attempt",
                  "max_attempts", "attempts", "not_before", "started_at", "finished_at", "duration_ms",
                  "lateness_ms", "output", "error", "worker", "heartbeat_at", "webhook_status", "created_at"]
        read_only_fields = fields

    def get_lateness_ms(self, run: JobRun) -> int | None:
        if run.started_at is None or run.trigger == JobRun.Trigger.MANUAL:
            return None
        return int((run.started_at - run.scheduled_for).total_seconds() * 1000)


class SchedulePreviewResultSerializer(serializers.Serializer):
    description = serializers.CharField()
    next_fire_times = serializers.ListField(child=serializers.DateTimeField())
    timezone = serializers.CharField()
