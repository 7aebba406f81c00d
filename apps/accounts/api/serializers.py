from __future__ import annotations

import ipaddress

from rest_framework import serializers

from apps.accounts.models import ApiToken, Invitation, Membership, Organization, Role, Scope
from apps.core import quotas
from apps.core.api.fields import SlugNameField, TenantModelSerializer


class OrganizationSerializer(TenantModelSerializer):
    slug = SlugNameField()

    class Meta:
        model = Organization
        fields = ["id", "slug", "name", "kind", "max_test_rate", "max_test_duration_s", "max_test_concurrency",
                  "member_networks", "quotas", "usage", "created_at"]
        read_only_fields = ["created_at"]

    quotas = serializers.JSONField(required=False, help_text="Overrides of the per-org quotas, {name: limit}; "
                                   "names and defaults in `usage`.")
    usage = serializers.SerializerMethodField(help_text="Every quota: its limit for this org (null: unlimited, the "
                                              "operator org) and what the org uses now.")

    def get_usage(self, org: Organization) -> list[dict]:
        return quotas.usage(org)

    def validate_quotas(self, value):
        try:
            return quotas.validate_overrides(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc), code="invalid_quota") from exc

    def validate_member_networks(self, value):
        if not isinstance(value, list) or len(value) > 50:
            raise serializers.ValidationError("A list of at most 50 CIDRs.", code="invalid_cidr")
        nets = []
        for cidr in value:
            try:
                nets.append(str(ipaddress.ip_network(str(cidr), strict=True)))
            except ValueError as exc:
                raise serializers.ValidationError(f"{cidr!r} is not a network in CIDR form: {exc}",
                                                  code="invalid_cidr") from exc
        return nets


class ApiTokenSerializer(TenantModelSerializer):
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), min_length=1)

    class Meta:
        model = ApiToken
        fields = ["id", "org", "name", "prefix", "scopes", "expires_at", "revoked_at", "last_used_at", "created_at"]
        read_only_fields = ["prefix", "revoked_at", "last_used_at", "created_at"]


class MembershipSerializer(TenantModelSerializer):
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    username = serializers.CharField(source="user.username", max_length=150,
                                     help_text="The member's username (fixed: members join by invitation).")
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Membership
        fields = ["id", "org", "username", "role", "created_at"]
        read_only_fields = ["id", "org", "created_at"]

    def validate_username(self, value: str) -> str:
        if self.instance is not None and value != self.instance.user.username:
            raise serializers.ValidationError("A membership's user cannot change; remove it and add the other user.",
                                              code="immutable")
        return value


class InvitationSerializer(TenantModelSerializer):
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    username = serializers.CharField(max_length=150, help_text="Who is invited. Any username: the answer is the same "
                                     "whether or not the account exists yet.")
    role = serializers.ChoiceField(choices=Role.choices)

    class Meta:
        model = Invitation
        fields = ["id", "org", "username", "role", "status", "invited_by", "expires_at", "decided_at", "created_at"]
        read_only_fields = ["id", "org", "status", "invited_by", "expires_at", "decided_at", "created_at"]
        validators: list = []  # one pending per user and org: the service refreshes the pending one
