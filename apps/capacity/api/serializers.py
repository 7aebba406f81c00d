"""Capacity API serializers: validate shapes at the edge; the services check targets and caps."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers

from apps.accounts.models import Organization
from apps.balancers.models import Pool, Region
from apps.capacity import safety
from apps.capacity.models import CapacityRun, CapacityShard, CapacityTest, Drill, StepResult, TargetAllowlist
from apps.capacity.rules import DRILL_DURATION_S, DRILL_P99_MS, DRILL_SHARE
from apps.core import netpolicy, validators
from apps.core.api.fields import (
    HostnameField,
    PathField,
    ScopedRelatedField,
    ScopedSlugRelatedField,
    SlugNameField,
    TenantModelSerializer,
)
from apps.core.errors import DomainError


class StepsField(serializers.JSONField):
    """[[rate_or_users, duration_s], ...] or bare numbers (each lasting step_duration_s)."""

    def to_internal_value(self, data: Any) -> Any:
        value = super().to_internal_value(data)
        if not isinstance(value, list) or not value:
            raise serializers.ValidationError("Give a non-empty list of steps.", code="invalid_steps")
        return value


class CapacityTestSerializer(TenantModelSerializer):
    org = ScopedSlugRelatedField(Organization, required=False)
    name = SlugNameField()
    # Plain ids: whether a listener or route may be targeted is the service's call (target_not_owned),
    # with the same answer for a foreign id as for a missing one.
    listener = serializers.IntegerField(source="listener_id", required=False, allow_null=True, min_value=1)
    route = serializers.IntegerField(source="route_id", required=False, allow_null=True, min_value=1)
    hostname = HostnameField(required=False, allow_blank=True)
    path = PathField(required=False)
    address = serializers.CharField(max_length=253, required=False, allow_blank=True)
    port = serializers.IntegerField(min_value=1, max_value=65535, required=False, allow_null=True)
    steps = StepsField()
    step_duration_s = serializers.FloatField(min_value=0.1, max_value=3600, required=False)
    think_time_s = serializers.FloatField(min_value=0, max_value=60, required=False)
    max_connections = serializers.IntegerField(min_value=1, max_value=10_000, required=False)
    slo_p99_ms = serializers.FloatField(min_value=0.001, max_value=60_000, required=False)
    slo_error_rate = serializers.FloatField(min_value=0, max_value=1, required=False)
    shards = serializers.IntegerField(min_value=1, max_value=16, required=False)
    safety_factor = serializers.FloatField(min_value=0.01, max_value=1, required=False)
    pool = ScopedRelatedField(Pool, required=False, allow_null=True)
    region = ScopedSlugRelatedField(Region, required=False, allow_null=True)
    timeout_s = serializers.FloatField(min_value=0.01, max_value=60, required=False)
    last_run = serializers.SerializerMethodField()

    class Meta:
        model = CapacityTest
        fields = ["id", "org", "name", "listener", "route", "hostname", "path", "address", "port", "mode", "steps",
                  "step_duration_s", "think_time_s", "max_connections", "slo_p99_ms", "slo_error_rate", "shards",
                  "safety_factor", "pool", "region", "timeout_s", "created_by", "created_at", "updated_at",
                  "last_run"]
        read_only_fields = ["created_by", "created_at", "updated_at"]
        # (org, name) uniqueness is the service's (409 name_taken); DRF's generated validator
        # would make org required.
        validators: list = []

    def validate_org(self, org):
        principal = self.context["request"].principal
        if not principal.is_operator and org.pk != principal.org_id:
            raise serializers.ValidationError("You can only create tests for your own organization.")
        return org

    def validate_address(self, value: str) -> str:
        """An external target: an IP literal or a concrete hostname (still subject to the allowlist)."""
        if not value:
            return value
        if safety.parse_ip(value) is not None:
            return str(safety.parse_ip(value))
        try:
            return validators.validate_hostname(value, allow_wildcard=False)
        except validators.InvalidValue as exc:
            raise serializers.ValidationError(exc.message, code=exc.code) from exc

    def validate_hostname(self, value: str) -> str:
        if value.startswith("*."):
            raise serializers.ValidationError("Name one concrete hostname, not a wildcard.", code="invalid_hostname")
        return value

    def validate(self, attrs):
        attrs = super().validate(attrs)
        if self.instance is None and "org" not in attrs:
            attrs["org"] = self.context["request"].principal.org
        if self.instance is not None and "org" in attrs and attrs["org"] != self.instance.org:
            raise serializers.ValidationError({"org": ["A test cannot move to another organization."]})
        listener = attrs.get("listener_id", getattr(self.instance, "listener_id", None))
        address = attrs.get("address", getattr(self.instance, "address", ""))
        if listener is not None and address:
            # Both would be ambiguous (which one does the load hit?); silently preferring one misled users.
            raise DomainError("ambiguous_target", "Name a listener or an address, not both.", field="address",
                              status=422)
        return attrs

    def get_last_run(self, test: CapacityTest) -> dict[str, Any] | None:
        run = test.runs.order_by("-created_at", "-id").first()
        if run is None:
            return None
        return {"id": run.pk, "status": run.status, "knee_capacity_rps": run.knee_capacity_rps,
                "created_at": run.created_at}


class StepResultSerializer(TenantModelSerializer):
    error_rate = serializers.FloatField(read_only=True)

    class Meta:
        model = StepResult
        fields = ["index", "shard", "offered_rate", "achieved_rate", "duration_s", "users", "sent", "ok", "errors",
                  "error_count", "error_rate", "pool_exhausted", "p50_ms", "p90_ms", "p99_ms", "p999_ms", "max_ms"]


class StepResultWithHistogramSerializer(StepResultSerializer):
    class Meta(StepResultSerializer.Meta):
        fields = [*StepResultSerializer.Meta.fields, "histogram"]


class CapacityShardSerializer(TenantModelSerializer):
    class Meta:
        model = CapacityShard
        fields = ["index", "status", "worker", "percent", "current_step", "achieved_rate", "sent", "ok", "errors",
                  "stopped_reason", "start_skew_s", "error", "started_at", "finished_at"]


class CapacityRunSerializer(TenantModelSerializer):
    test_name = serializers.CharField(source="test.name", read_only=True)
    steps = serializers.SerializerMethodField()

    class Meta:
        model = CapacityRun
        fields = ["id", "test", "test_name", "status", "requested_by", "target_address", "target_host_header",
                  "peak_rate", "concurrency", "shards_total", "shards_done", "progress_percent", "current_step",
                  "step_count", "achieved_rate", "sent", "ok", "errors", "stopped_reason", "error_code", "error",
                  "knee_capacity_rps", "knee_step_index", "knee_code", "knee_reason", "pool_region",
                  "healthy_members", "recommended_max_rate_per_member", "recommendation_note", "applied_at",
                  "applied_by", "created_at", "started_at", "finished_at", "steps"]
        read_only_fields = fields

    def get_steps(self, run: CapacityRun) -> list[dict[str, Any]]:
        rows = [r for r in run.step_results.all() if r.shard is None]
        return StepResultSerializer(sorted(rows, key=lambda r: r.index), many=True).data


class CapacityRunListSerializer(CapacityRunSerializer):
    class Meta(CapacityRunSerializer.Meta):
        fields = [f for f in CapacityRunSerializer.Meta.fields if f != "steps"]


class ShardProgressSerializer(serializers.Serializer):
    index = serializers.IntegerField()
    status = serializers.ChoiceField(choices=CapacityShard.Status.choices)
    percent = serializers.FloatField()
    current_step = serializers.IntegerField()
    achieved_rate = serializers.FloatField()
    sent = serializers.IntegerField()
    ok = serializers.IntegerField()
    errors = serializers.IntegerField()
    worker = serializers.CharField(allow_blank=True)
    stopped_reason = serializers.CharField(allow_blank=True)
    start_skew_s = serializers.FloatField(allow_null=True)


class RunProgressSerializer(serializers.Serializer):
    """GET /capacity-runs/{id}/progress/ (selectors.run_progress)."""

    id = serializers.IntegerField()
    status = serializers.ChoiceField(choices=CapacityRun.Status.choices)
    progress_percent = serializers.FloatField()
    current_step = serializers.IntegerField()
    step_count = serializers.IntegerField()
    achieved_rate = serializers.FloatField(help_text="req/s")
    sent = serializers.IntegerField()
    ok = serializers.IntegerField()
    errors = serializers.IntegerField()
    stopped_reason = serializers.CharField(allow_blank=True)
    error_code = serializers.CharField(allow_blank=True)
    error = serializers.CharField(allow_blank=True)
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    shards = ShardProgressSerializer(many=True)


class RunResultsSerializer(serializers.Serializer):
    """GET /capacity-runs/{id}/results/: steps carry `histogram` too with ?histograms=1."""

    run = serializers.IntegerField()
    status = serializers.ChoiceField(choices=CapacityRun.Status.choices)
    steps = StepResultSerializer(many=True)
    shards = CapacityShardSerializer(many=True)


class RunChartSerializer(serializers.Serializer):
    """GET /capacity-runs/{id}/chart/ (selectors.run_chart): one array entry per step."""

    run = serializers.IntegerField()
    label = serializers.CharField()
    offered_rate = serializers.ListField(child=serializers.FloatField())
    achieved_rate = serializers.ListField(child=serializers.FloatField())
    p50_ms = serializers.ListField(child=serializers.FloatField(allow_null=True))
    p99_ms = serializers.ListField(child=serializers.FloatField(allow_null=True))
    errors = serializers.ListField(child=serializers.IntegerField())
    ok = serializers.ListField(child=serializers.IntegerField())
    knee_index = serializers.IntegerField(allow_null=True)
    knee_capacity_rps = serializers.FloatField(allow_null=True)
    slo_p99_ms = serializers.FloatField()


class TargetAllowlistSerializer(TenantModelSerializer):
    org = ScopedSlugRelatedField(Organization, required=False, allow_null=True)
    cidr = serializers.CharField(max_length=64, required=False, allow_blank=True)
    hostname = HostnameField(required=False, allow_blank=True)
    ports = serializers.CharField(max_length=200, required=False, allow_blank=True)
    applies_to_all_orgs = serializers.BooleanField(write_only=True, required=False, default=False)
    note = serializers.CharField(max_length=200, required=False, allow_blank=True)

    class Meta:
        model = TargetAllowlist
        fields = ["id", "org", "cidr", "hostname", "ports", "applies_to_all_orgs", "note", "created_by",
                  "created_at"]
        read_only_fields = ["created_by", "created_at"]

    def validate_ports(self, value: str) -> str:
        try:
            netpolicy.parse_ports(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc), code="invalid_ports") from exc
        return value.replace(" ", "")

    def validate(self, attrs):
        attrs = super().validate(attrs)
        everyone = attrs.pop("applies_to_all_orgs", False)
        if attrs.get("org") is None and not everyone:
            raise serializers.ValidationError(
                {"org": ["Name the organization this entry is for, or set applies_to_all_orgs: true."]},
                code="org_required")
        if attrs.get("org") is not None and everyone:
            raise serializers.ValidationError({"applies_to_all_orgs": ["An entry is for one org or for all."]},
                                              code="invalid")
        return attrs


class DrillSerializer(TenantModelSerializer):
    """A failover drill: POST starts one (the service checks region, ranges, limits and whose test it is)."""

    pool = ScopedRelatedField(Pool, action="change")
    region = ScopedSlugRelatedField(Region)
    test = ScopedRelatedField(CapacityTest, required=False, allow_null=True)
    share = serializers.FloatField(min_value=DRILL_SHARE[0], max_value=DRILL_SHARE[1], default=1.0)
    duration_s = serializers.FloatField(min_value=DRILL_DURATION_S[0], max_value=DRILL_DURATION_S[1], default=60.0)
    slo_p99_ms = serializers.FloatField(min_value=DRILL_P99_MS[0], max_value=DRILL_P99_MS[1], required=False,
                                        allow_null=True)
    slo_error_rate = serializers.FloatField(min_value=0.0, max_value=1.0, default=0.01)

    class Meta:
        model = Drill
        fields = ["id", "pool", "region", "share", "duration_s", "test", "slo_p99_ms", "slo_error_rate", "status",
                  "phase", "requested_by", "reason", "failed_check", "summary", "capacity_run", "created_at",
                  "started_at", "drained_at", "restored_at", "finished_at"]
        read_only_fields = ["status", "phase", "requested_by", "reason", "failed_check", "summary", "capacity_run",
                            "created_at", "started_at", "drained_at", "restored_at", "finished_at"]


class DrillDetailSerializer(DrillSerializer):
    class Meta(DrillSerializer.Meta):
        fields = [*DrillSerializer.Meta.fields, "samples"]
        read_only_fields = [*DrillSerializer.Meta.read_only_fields, "samples"]
