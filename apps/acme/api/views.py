from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.acme import services
from apps.acme.api import serializers as s
from apps.acme.models import ManagedCertificate
from apps.core.api.serializers import EmptySerializer, QueuedSerializer
from apps.core.api.viewsets import TenantViewSet


class ManagedCertificateViewSet(TenantViewSet):
    """Certificates Spillway obtains from an ACME CA and renews by itself."""

    model = ManagedCertificate
    serializer_class = s.ManagedCertificateSerializer
    select_related = ("org", "certificate")
    filterset_fields = ["name", "status"]

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.managed_certificate_request(
            principal=self.principal, name=data["name"], hostnames=data["hostnames"],
            challenge=data.get("challenge", ManagedCertificate.Challenge.HTTP01), org=data.get("org"),
            certificate=data.get("certificate"))

    def perform_update(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.managed_certificate_update(
            principal=self.principal, managed=serializer.instance,
            hostnames=data.get("hostnames", serializer.instance.hostnames))

    def perform_destroy(self, instance):
        services.managed_certificate_delete(principal=self.principal, managed=instance)

    @extend_schema(request=None, responses={202: QueuedSerializer})
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def renew(self, request, pk=None):
        """Order a new certificate now (it replaces the current one once issued)."""
        managed = self.get_object()
        services.managed_certificate_renew_now(principal=self.principal, managed=managed)
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)
