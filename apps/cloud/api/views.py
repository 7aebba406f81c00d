"""Cloud API: targets (CRUD) and applies (create = limits check + queued synthesize/plan, approve, JSON)."""

from __future__ import annotations

import json

from django.http import HttpResponse
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.cloud import services
from apps.cloud.api import serializers as s
from apps.cloud.models import CloudApply, CloudCredential, CloudTarget
from apps.core.api.errors import ApiError
from apps.core.api.viewsets import TenantViewSet, etag_for


class CanDeploy(permissions.BasePermission):
    """Approving an apply: an editor whose token carries the deploy scope (write alone is not asked)."""

    message = "Approving an apply needs an editor with the deploy scope."

    def has_permission(self, request, view) -> bool:
        principal = getattr(request, "principal", None)
        return principal is not None and principal.can_deploy


class CloudCredentialViewSet(TenantViewSet):
    """Credentials (by reference) and state backends operators offer to orgs' cloud targets."""

    model = CloudCredential
    serializer_class = s.CloudCredentialSerializer
    operator_only_write = True
    prefetch_related = ("orgs",)

    def perform_create(self, serializer):
        serializer.instance = services.save_credential(principal=self.principal, credential=CloudCredential(),
                                                       data=serializer.validated_data)

    def perform_update(self, serializer):
        services.save_credential(principal=self.principal, credential=serializer.instance,
                                 data=serializer.validated_data)

    def perform_destroy(self, instance):
        services.delete_credential(principal=self.principal, credential=instance)


class CloudTargetViewSet(TenantViewSet):
    model = CloudTarget
    serializer_class = s.CloudTargetSerializer
    select_related = ("org",)

    def perform_create(self, serializer):
        serializer.instance = services.save_target(principal=self.principal, target=CloudTarget(),
                                                   data=serializer.validated_data)

    def perform_update(self, serializer):
        services.save_target(principal=self.principal, target=serializer.instance, data=serializer.validated_data)

    def perform_destroy(self, instance):
        services.delete_target(principal=self.principal, target=instance)


class CloudApplyViewSet(TenantViewSet):
    model = CloudApply
    serializer_class = s.CloudApplySerializer
    select_related = ("target", "lb")
    http_method_names = ["get", "post", "head", "options"]
    filterset_fields = ["status", "target", "lb"]

    def get_permissions(self):
        if self.action == "approve":
            return [CanDeploy()]
        return super().get_permissions()

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.create_apply(principal=self.principal, target=data["target"], lb=data["lb"])

    @extend_schema(request=None, responses={202: s.CloudApplySerializer})
    @action(detail=True, methods=["post"])
    def approve(self, request, pk=None):
        apply = services.approve(principal=self.principal, apply=self.get_object())
        data = self.get_serializer(apply).data
        return Response(data, status=status.HTTP_202_ACCEPTED, headers={"ETag": etag_for(data)})

    @action(detail=True, methods=["get"], url_path="synth")
    def synth(self, request, pk=None):
        apply = self.get_object()
        if apply.synth_json is None:
            raise ApiError("not_synthesized", f"This run is {apply.status}; nothing has been synthesized yet.",
                           status.HTTP_409_CONFLICT)
        return synth_download(apply)


def synth_download(apply: CloudApply) -> HttpResponse:
    body = json.dumps(apply.synth_json, indent=2, sort_keys=True)
    response = HttpResponse(body, content_type="application/json")
    response["Content-Disposition"] = f'attachment; filename="{apply.lb.name}-{apply.pk}.main.tf.json"'
    return response
