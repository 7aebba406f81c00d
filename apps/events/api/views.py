"""Events API: the org's event stream, its subscriptions (with "send test event"), the delivery log."""

from __future__ import annotations

from django_filters import rest_framework as filters
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.core.api.serializers import EmptySerializer
from apps.core.api.viewsets import TenantViewSet
from apps.events import services
from apps.events.api import serializers as s
from apps.events.models import Delivery, Event, Subscription


class EventFilter(filters.FilterSet):
    since = filters.IsoDateTimeFilter(field_name="at", lookup_expr="gte")
    until = filters.IsoDateTimeFilter(field_name="at", lookup_expr="lt")

    class Meta:
        model = Event
        fields = ["type", "object_type", "object_id"]


class EventViewSet(TenantViewSet):
    """What happened to the caller's objects (operators: everything), newest first. Read-only."""

    model = Event
    serializer_class = s.EventSerializer
    filterset_class = EventFilter
    select_related = ("org",)
    http_method_names = ["get", "head", "options"]


class SubscriptionViewSet(TenantViewSet):
    """Webhook subscriptions to the org's events (generic JSON or Slack-compatible body, signed)."""

    model = Subscription
    serializer_class = s.SubscriptionSerializer
    select_related = ("org",)
    filterset_fields = ["enabled", "format", "name"]

    def _save(self, serializer, sub: Subscription) -> Subscription:
        data = dict(serializer.validated_data)
        secret = data.pop("secret", None)
        return services.subscription_save(principal=self.principal, subscription=sub, data=data, secret=secret)

    def perform_create(self, serializer):
        serializer.instance = self._save(serializer, Subscription())

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance)

    def perform_destroy(self, instance):
        services.subscription_delete(principal=self.principal, subscription=instance)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def test(self, request, pk=None):
        """Send a `test` event to this subscription only; answers 202 with the event (see the delivery log)."""
        sub = self.get_object()  # a write: viewers get 403, foreign ids 404
        event = services.subscription_send_test(principal=self.principal, subscription=sub)
        return Response(s.EventSerializer(event).data, status=status.HTTP_202_ACCEPTED)


class DeliveryViewSet(TenantViewSet):
    """The delivery log: one row per (subscription, event), with attempts and the last answer."""

    model = Delivery
    serializer_class = s.DeliverySerializer
    select_related = ("event", "subscription")
    filterset_fields = ["subscription", "event", "status"]
    http_method_names = ["get", "head", "options"]
