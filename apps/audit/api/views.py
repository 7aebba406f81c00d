from __future__ import annotations

from django_filters import rest_framework as filters
from rest_framework import serializers

from apps.audit.models import AuditEvent
from apps.core.api.fields import TenantModelSerializer
from apps.core.api.viewsets import TenantViewSet


class AuditEventSerializer(TenantModelSerializer):
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)

    class Meta:
        model = AuditEvent
        fields = ["id", "at", "actor", "actor_label", "org", "action", "object_type", "object_id", "object_repr",
                  "before", "after", "request_id"]
        read_only_fields = fields


class AuditEventFilter(filters.FilterSet):
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")
    action = filters.CharFilter(lookup_expr="startswith")

    class Meta:
        model = AuditEvent
        fields = ["action", "object_type", "object_id", "actor", "request_id"]


class AuditEventViewSet(TenantViewSet):
    """Read-only by construction: the audit log is append-only."""

    model = AuditEvent
    serializer_class = AuditEventSerializer
    filterset_class = AuditEventFilter
    select_related = ("org",)
    http_method_names = ["get", "head", "options"]
