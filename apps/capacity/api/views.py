"""Capacity API: tests (CRUD, start), runs (results, progress, cancel, apply), target allowlist."""

from __future__ import annotations

from django.db.models import Prefetch
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.exceptions import MethodNotAllowed
from rest_framework.response import Response

from apps.capacity import selectors, services
from apps.capacity.api import serializers as s
from apps.capacity.models import CapacityRun, CapacityTest, Drill, StepResult, TargetAllowlist
from apps.core.api.schema import IDEMPOTENCY_KEY
from apps.core.api.serializers import EmptySerializer
from apps.core.api.viewsets import TenantViewSet, etag_for


class CapacityTestViewSet(TenantViewSet):
    model = CapacityTest
    serializer_class = s.CapacityTestSerializer
    select_related = ("org", "pool", "region")
    filterset_fields = ["mode", "listener", "pool", "name"]
    ordering_fields = ["name", "created_at"]
    _starting: CapacityTest | None = None

    def perform_create(self, serializer):
        serializer.instance = services.capacity_test_save(principal=self.principal, test=CapacityTest(),
                                                          data=self._data(serializer))

    def perform_update(self, serializer):
        services.capacity_test_save(principal=self.principal, test=serializer.instance, data=self._data(serializer))

    def perform_destroy(self, instance):
        services.capacity_test_delete(principal=self.principal, test=instance)

    @staticmethod
    def _data(serializer) -> dict:
        return dict(serializer.validated_data)

    @extend_schema(request=None, responses={201: s.CapacityRunSerializer}, parameters=[IDEMPOTENCY_KEY])
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def start(self, request, pk=None):
        """Start a run of this test: 201 with the run (pending; the workers take it from there)."""
        self._starting = self.get_object()
        return self.create(request)  # same Idempotency-Key handling as any POST

    def _create(self, request, *args, **kwargs):
        if self._starting is None:
            return super()._create(request, *args, **kwargs)
        run = services.capacity_run_start(principal=self.principal, test=self._starting)
        data = s.CapacityRunSerializer(run, context=self.get_serializer_context()).data
        return Response(data, status=status.HTTP_201_CREATED, headers={"Location": f"/api/v1/capacity-runs/{run.pk}/"})


class CapacityRunViewSet(TenantViewSet):
    model = CapacityRun
    serializer_class = s.CapacityRunSerializer
    select_related = ("test", "test__org")
    filterset_fields = ["test", "status"]
    ordering_fields = ["created_at", "knee_capacity_rps"]
    http_method_names = ["get", "post", "head", "options"]

    def scope_queryset(self, qs):
        if self.action == "retrieve":
            qs = qs.prefetch_related(Prefetch("step_results", queryset=StepResult.objects.filter(shard__isnull=True)))
        return qs

    def get_serializer_class(self):
        if self.action == "list":
            return s.CapacityRunListSerializer
        return super().get_serializer_class()

    create = None  # runs are started from their test: no POST route here (controlplane.api.Router)

    def http_method_not_allowed(self, request, *args, **kwargs):
        if request.method == "POST" and self.action is None:
            raise MethodNotAllowed("POST", detail="Start a run with POST /api/v1/capacity-tests/{id}/start/.")
        return super().http_method_not_allowed(request, *args, **kwargs)

    @extend_schema(responses={200: s.RunProgressSerializer})
    @action(detail=True, methods=["get"])
    def progress(self, request, pk=None):
        """Live progress: percent, current step, achieved rate (req/s), per-shard rows."""
        return Response(s.RunProgressSerializer(selectors.run_progress(self.get_object())).data)

    @extend_schema(responses={200: s.RunResultsSerializer})
    @action(detail=True, methods=["get"])
    def results(self, request, pk=None):
        """Step results: merged, or per shard with ?shards=1; encoded HdrHistograms with ?histograms=1."""
        run = self.get_object()
        rows = selectors.run_steps(run, merged=request.query_params.get("shards") != "1").order_by("index", "shard")
        cls = s.StepResultWithHistogramSerializer if request.query_params.get("histograms") == "1" else \
            s.StepResultSerializer
        return Response({"run": run.pk, "status": run.status, "steps": cls(rows, many=True).data,
                         "shards": s.CapacityShardSerializer(run.shard_rows.all(), many=True).data})

    @extend_schema(responses={200: s.RunChartSerializer})
    @action(detail=True, methods=["get"])
    def chart(self, request, pk=None):
        """Latency against offered rate (p50/p99), errors per step and the knee, for the UI chart."""
        return Response(s.RunChartSerializer(selectors.run_chart(self.get_object())).data)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def cancel(self, request, pk=None):
        run = services.capacity_run_cancel(principal=self.principal, run=self.get_object())
        return Response(s.CapacityRunListSerializer(run, context=self.get_serializer_context()).data)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def apply(self, request, pk=None):
        """Write the recommendation into the pool's regional max_rate_per_member (audited, revision bump)."""
        run = self.get_object()
        pool_region = services.capacity_apply_recommendation(principal=self.principal, run=run)
        run.refresh_from_db()
        data = s.CapacityRunListSerializer(run, context=self.get_serializer_context()).data
        data["pool_region_max_rate_per_member"] = pool_region.max_rate_per_member
        return Response(data, headers={"ETag": etag_for(data)})


class DrillViewSet(TenantViewSet):
    """Failover drills: start one (POST), follow it (GET: status, phase, summary; the detail has every second's
    sample), stop it (POST cancel: the region is restored within a second)."""

    model = Drill
    serializer_class = s.DrillSerializer
    select_related = ("pool", "region")
    filterset_fields = ["pool", "status"]
    ordering_fields = ["created_at"]
    http_method_names = ["get", "post", "head", "options"]

    def get_serializer_class(self):
        if self.action == "retrieve":
            return s.DrillDetailSerializer
        return super().get_serializer_class()

    def perform_create(self, serializer):
        serializer.instance = services.drill_start(principal=self.principal, **serializer.validated_data)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def cancel(self, request, pk=None):
        drill = services.drill_cancel(principal=self.principal, drill=self.get_object())
        return Response(s.DrillSerializer(drill, context=self.get_serializer_context()).data)


class TargetAllowlistViewSet(TenantViewSet):
    """Operators list the extra targets (CIDRs, hostnames) tenants may load; tenants read theirs."""

    model = TargetAllowlist
    serializer_class = s.TargetAllowlistSerializer
    select_related = ("org",)
    operator_only_write = True
    http_method_names = ["get", "post", "delete", "head", "options"]

    def perform_create(self, serializer):
        serializer.instance = services.allowlist_save(principal=self.principal, entry=TargetAllowlist(),
                                                      data=dict(serializer.validated_data))

    def perform_destroy(self, instance):
        services.allowlist_delete(principal=self.principal, entry=instance)
