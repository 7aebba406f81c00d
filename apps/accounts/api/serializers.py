from __future__ import annotations

from rest_framework import serializers

from apps.accounts.models import ApiToken, Organization, Scope
from apps.core.api.fields import SlugNameField, TenantModelSerializer


class OrganizationSerializer(TenantModelSerializer):
    slug = SlugNameField()

    class Meta:
        model = Organization
        fields = ["id", "slug", "name", "kind", "max_test_rate", "max_test_duration_s", "max_test_concurrency",
                  "created_at"]
        read_only_fields = ["created_at"]


class ApiTokenSerializer(TenantModelSerializer):
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    name = serializers.CharField(max_length=100)
    scopes = serializers.ListField(child=serializers.ChoiceField(choices=Scope.choices), min_length=1)

    class Meta:
        model = ApiToken
        fields = ["id", "org", "name", "prefix", "scopes", "expires_at", "revoked_at", "last_used_at", "created_at"]
        read_only_fields = ["prefix", "revoked_at", "last_used_at", "created_at"]
