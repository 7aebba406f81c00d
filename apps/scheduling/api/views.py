"""Scheduling API: thin viewsets over the services."""

from __future__ import annotations

from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.core.api.errors import PreconditionFailed
from apps.core.api.serializers import EmptySerializer
from apps.core.api.viewsets import TenantViewSet, etag_for
from apps.scheduling import services
from apps.scheduling.api import serializers as s
from apps.scheduling.models import Job, JobRun


def _stable_etag(data: dict) -> str:
    return etag_for({k: v for k, v in data.items() if k not in s.VOLATILE_FIELDS})


class JobViewSet(TenantViewSet):
    """Scheduled jobs. The representation carries `description` and `next_fire_times` (five, UTC)."""

    model = Job
    serializer_class = s.JobSerializer
    select_related = ("org",)
    filterset_fields = ["kind", "enabled", "schedule_type", "last_status", "name"]
    ordering_fields = ["name", "next_fire_at", "created_at", "last_run_at"]

    # --- writes go through services ---------------------------------------------------------

    def _save(self, serializer, job: Job) -> Job:
        data = dict(serializer.validated_data)
        secret = data.pop("webhook_secret", None)
        return services.job_save(principal=self.principal, job=job, data=data, webhook_secret=secret)

    def perform_create(self, serializer):
        serializer.instance = self._save(serializer, Job())

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance)

    def perform_destroy(self, instance):
        services.job_delete(principal=self.principal, job=instance)

    # --- ETag without the fields the dispatcher moves ----------------------------------------

    def _check_if_match(self, instance) -> None:
        wanted = self.request.headers.get("If-Match")
        if not wanted or wanted.strip() == "*":
            return
        current = _stable_etag(self.get_serializer(instance).data)
        if current not in {tag.strip().removeprefix("W/") for tag in wanted.split(",")}:
            raise PreconditionFailed()

    def retrieve(self, request, *args, **kwargs):
        response = super().retrieve(request, *args, **kwargs)
        response["ETag"] = _stable_etag(response.data)
        return response

    def update(self, request, *args, **kwargs):
        response = super().update(request, *args, **kwargs)
        response["ETag"] = _stable_etag(response.data)
        return response

    def _create(self, request, *args, **kwargs):
        response = super()._create(request, *args, **kwargs)
        response["ETag"] = _stable_etag(response.data)
        return response

    # --- actions -----------------------------------------------------------------------------

    @extend_schema(request=None, responses={202: s.JobRunSerializer})
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def run(self, request, pk=None):
        """Run now, outside the schedule (also while paused). Answers 202 with the new run."""
        run = services.job_run_now(principal=self.principal, job=self.get_object())
        return Response(s.JobRunSerializer(run).data, status=status.HTTP_202_ACCEPTED)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def pause(self, request, pk=None):
        job = services.job_pause(principal=self.principal, job=self.get_object())
        return Response(self._job_data(job))

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def resume(self, request, pk=None):
        job = services.job_resume(principal=self.principal, job=self.get_object())
        return Response(self._job_data(job))

    def _job_data(self, job: Job) -> dict:
        return s.JobSerializer(job, context=self.get_serializer_context()).data

    @extend_schema(parameters=[s.SchedulePreviewSerializer], responses={200: s.SchedulePreviewResultSerializer})
    @action(detail=False, methods=["get"], serializer_class=s.SchedulePreviewSerializer)
    def preview(self, request):
        """Description and next five fire times of a schedule, without saving anything."""
        serializer = s.SchedulePreviewSerializer(data=request.query_params)
        serializer.is_valid(raise_exception=True)
        result = s.schedule_preview(serializer.validated_data)
        if "code" in result:  # the API's error shape
            return Response({**result, "fields": {}}, status=status.HTTP_400_BAD_REQUEST)
        return Response(result)


class JobRunFilter(filters.FilterSet):
    scheduled_after = filters.IsoDateTimeFilter(field_name="scheduled_for", lookup_expr="gte")
    scheduled_before = filters.IsoDateTimeFilter(field_name="scheduled_for", lookup_expr="lt")

    class Meta:
        model = JobRun
        fields = ["job", "status", "trigger"]


class JobRunViewSet(TenantViewSet):
    """Run history, read-only (plus cancel)."""

    model = JobRun
    serializer_class = s.JobRunSerializer
    select_related = ("job", "job__org")
    filterset_class = JobRunFilter
    ordering_fields = ["scheduled_for", "started_at", "duration_ms"]
    http_method_names = ["get", "post", "head", "options"]

    create = None  # runs come from the schedule or POST /jobs/{id}/run/: no POST route (controlplane.api.Router)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def cancel(self, request, pk=None):
        run = services.run_cancel(principal=self.principal, run=self.get_object())
        return Response(s.JobRunSerializer(run).data)
