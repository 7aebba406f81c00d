from __future__ import annotations

from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import services
from apps.accounts.api.serializers import ApiTokenSerializer, MembershipSerializer, OrganizationSerializer
from apps.accounts.models import ApiToken, Membership, Organization, Role
from apps.audit.services import AuditAction, audited_delete, audited_save
from apps.core.api.serializers import EmptySerializer
from apps.core.api.viewsets import TenantViewSet


class OrganizationViewSet(TenantViewSet):
    model = Organization
    serializer_class = OrganizationSerializer
    operator_only_write = True
    write_role = Role.ADMIN
    filterset_fields = ["kind", "slug"]

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.org_create(slug=data["slug"], name=data["name"],
                                                  kind=data.get("kind", Organization.Kind.CUSTOMER),
                                                  principal=self.principal)

    def perform_update(self, serializer):
        audited_save(principal=self.principal, obj=serializer.instance, action=AuditAction.UPDATE,
                     data=serializer.validated_data)

    def perform_destroy(self, instance):
        audited_delete(principal=self.principal, obj=instance)


class ApiTokenViewSet(TenantViewSet):
    """Tokens: the secret is in the create response only; it is never stored or shown again."""

    model = ApiToken
    serializer_class = ApiTokenSerializer
    write_role = Role.ADMIN
    select_related = ("org",)
    http_method_names = ["get", "post", "delete", "head", "options"]
    idempotency_redact = ("token",)  # a replay answers with the token's record, never its secret again

    def _create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        issued = services.token_create(org=self.principal.org, name=data["name"], scopes=data["scopes"],
                                       expires_at=data.get("expires_at"), principal=self.principal)
        body = dict(ApiTokenSerializer(issued.token).data)
        body["token"] = issued.secret
        return Response(body, status=status.HTTP_201_CREATED)

    def perform_destroy(self, instance):
        services.token_revoke(token=instance, principal=self.principal)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def revoke(self, request, pk=None):
        token = services.token_revoke(token=self.get_object(), principal=self.principal)
        return Response(ApiTokenSerializer(token).data)


class MembershipViewSet(TenantViewSet):
    """Members of your org and their roles; owners and admins manage them (only owners touch owners)."""

    model = Membership
    serializer_class = MembershipSerializer
    write_role = Role.ADMIN
    select_related = ("org", "user")
    filterset_fields = ["role"]

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.membership_add(principal=self.principal, org=self.principal.org,
                                                      username=data["user"]["username"], role=data["role"])

    def perform_update(self, serializer):
        if "role" in serializer.validated_data:
            serializer.instance = services.membership_set_role(principal=self.principal,
                                                               membership=serializer.instance,
                                                               role=serializer.validated_data["role"])

    def perform_destroy(self, instance):
        services.membership_remove(principal=self.principal, membership=instance)
