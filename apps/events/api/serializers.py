from __future__ import annotations

from rest_framework import serializers

from apps.core.api.fields import TenantModelSerializer
from apps.events import types
from apps.events.models import Delivery, Event, Subscription


class EventSerializer(TenantModelSerializer):
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    summary = serializers.SerializerMethodField()

    class Meta:
        model = Event
        fields = ["id", "at", "org", "type", "object_type", "object_id", "object_repr", "summary", "data"]
        read_only_fields = fields

    def get_summary(self, event: Event) -> str:
        return types.summary(event.type, event.object_repr, event.data)


class SubscriptionSerializer(TenantModelSerializer):
    org = serializers.SlugRelatedField(slug_field="slug", read_only=True)
    url = serializers.CharField(max_length=2048)
    types = serializers.ListField(child=serializers.ChoiceField(choices=sorted(set(types.TYPES) - {"test"})),
                                  required=False, max_length=len(types.TYPES),
                                  help_text="Event types to receive; empty means every type.")
    secret = serializers.CharField(max_length=256, required=False, allow_blank=True, write_only=True,
                                   trim_whitespace=False,
                                   help_text="HMAC-SHA256 signing key (X-Spillway-Signature); never shown.")
    secret_set = serializers.SerializerMethodField()

    class Meta:
        model = Subscription
        fields = ["id", "org", "name", "url", "format", "types", "enabled", "secret", "secret_set", "created_at"]
        read_only_fields = ["id", "org", "secret_set", "created_at"]

    def get_secret_set(self, sub: Subscription) -> bool:
        return bool(sub.secret_encrypted)


class DeliverySerializer(TenantModelSerializer):
    event_type = serializers.CharField(source="event.type", read_only=True)

    class Meta:
        model = Delivery
        fields = ["id", "subscription", "event", "event_type", "status", "attempts", "next_attempt_at",
                  "last_status_code", "last_error", "duration_ms", "delivered_at", "created_at"]
        read_only_fields = fields
