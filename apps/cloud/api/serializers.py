"""Cloud API serializers. The credentials reference is write-only: no response ever carries it."""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from rest_framework import serializers

from apps.balancers.models import LoadBalancer
from apps.cloud import services, terraform_cli
from apps.cloud.models import CloudApply, CloudCredential, CloudTarget
from apps.cloud.regions import PATTERNS, UnmappedRegion, complete_region_map
from apps.core.api.fields import ScopedRelatedField, SlugNameField, TenantModelSerializer

NETWORK_KEYS = {"network", "zone", "subnet_ids", "security_group_ids"}


class CloudTargetSerializer(TenantModelSerializer):
    name = SlugNameField()
    credentials_ref = serializers.CharField(max_length=256, required=False, allow_blank=True, write_only=True)
    has_credentials = serializers.SerializerMethodField()
    apply_unavailable = serializers.SerializerMethodField()

    class Meta:
        model = CloudTarget
        fields = ["id", "name", "provider", "project_or_account", "regions", "region_map", "networks",
                  "certificate_refs",
                  "credential", "state_backend", "credentials_ref", "has_credentials", "apply_unavailable",
                  "created_at"]
        read_only_fields = ["created_at"]
        # A reference is read from the worker's environment or disk, a backend is where state is written:
        # operators set those; a tenant picks a `credential` an operator offers it.
        operator_only_fields = ("credentials_ref", "state_backend")

    def get_has_credentials(self, obj: CloudTarget) -> bool:
        return bool(obj.effective_credentials_ref)

    def validate(self, attrs):
        attrs = super().validate(attrs)
        credential = attrs.get("credential", getattr(self.instance, "credential", None))
        provider = attrs.get("provider", getattr(self.instance, "provider", None))
        if credential is not None and credential.provider != provider:
            raise serializers.ValidationError({"credential": [f"That credential is for {credential.provider}."]},
                                              code="provider_mismatch")
        regions = attrs.get("regions", getattr(self.instance, "regions", None)) or []
        region_map = attrs.get("region_map", getattr(self.instance, "region_map", None)) or {}
        if not isinstance(region_map, dict):
            raise serializers.ValidationError({"region_map": ["An object of Spillway region -> provider region."]})
        if provider in PATTERNS:
            try:
                attrs["region_map"] = complete_region_map(provider, regions, region_map)
            except UnmappedRegion as exc:
                raise serializers.ValidationError({"region_map": [str(exc)]}, code="region_unmapped") from None
        return attrs

    def get_apply_unavailable(self, obj: CloudTarget) -> str | None:
        return services.apply_unavailable_reason(obj)

    def validate_credentials_ref(self, value: str) -> str:
        # Only a name or a path: a pasted secret would end up in the database, which this field forbids.
        if value and not terraform_cli.ENV_REF_RE.fullmatch(value) and not (
                value.startswith("/") and ".." not in PurePosixPath(value).parts and "\n" not in value):
            raise serializers.ValidationError(
                "Give the NAME of an environment variable (A-Z, 0-9, _) or an absolute file path on the "
                "worker, never the secret itself.")
        return value

    def validate_regions(self, value: Any) -> list[str]:
        if not isinstance(value, list) or not value or not all(isinstance(r, str) and r for r in value):
            raise serializers.ValidationError("A non-empty list of region names.")
        return value

    def validate_networks(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise serializers.ValidationError("An object keyed by region.")
        for region, net in value.items():
            if not isinstance(net, dict) or set(net) - NETWORK_KEYS:
                raise serializers.ValidationError(
                    f"Region {region}: an object with keys {', '.join(sorted(NETWORK_KEYS))}.")
        return value

    def validate_certificate_refs(self, value: Any) -> dict[str, str]:
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise serializers.ValidationError("An object of listener name -> certificate reference.")
        return value

    def validate_state_backend(self, value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or len(value) > 1:
            raise serializers.ValidationError('One backend, e.g. {"gcs": {"bucket": "b", "prefix": "p"}}.')
        return value


class CloudApplySerializer(TenantModelSerializer):
    target = ScopedRelatedField(CloudTarget)
    lb = ScopedRelatedField(LoadBalancer)
    has_synth_json = serializers.SerializerMethodField()
    apply_unavailable = serializers.SerializerMethodField()

    class Meta:
        model = CloudApply
        fields = ["id", "target", "lb", "lb_revision", "status", "drift_check", "has_synth_json", "plan_output",
                  "diff", "apply_output", "error", "created_by", "approved_by", "approved_at", "apply_unavailable",
                  "created_at", "updated_at", "finished_at"]
        read_only_fields = [f for f in fields if f not in ("target", "lb")]

    def get_has_synth_json(self, obj: CloudApply) -> bool:
        return obj.synth_json is not None

    def get_apply_unavailable(self, obj: CloudApply) -> str | None:
        return services.apply_unavailable_reason(obj.target)


class CloudCredentialSerializer(TenantModelSerializer):
    """Operator-managed; the reference itself is write-only, like a target's."""

    name = SlugNameField()
    credentials_ref = serializers.CharField(max_length=256, write_only=True)

    class Meta:
        model = CloudCredential
        fields = ["id", "name", "provider", "credentials_ref", "state_backend", "orgs", "for_all_orgs", "created_at"]
        read_only_fields = ["created_at"]

    validate_credentials_ref = CloudTargetSerializer.validate_credentials_ref
    validate_state_backend = CloudTargetSerializer.validate_state_backend
