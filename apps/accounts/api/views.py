from __future__ import annotations

from django.http import Http404
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.accounts import services
from apps.accounts.api.serializers import (
    ApiTokenSerializer,
    InvitationSerializer,
    MembershipSerializer,
    OrganizationSerializer,
)
from apps.accounts.models import ApiToken, Invitation, Membership, Organization, Role
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
    """Members of your org and their roles; owners and admins change roles and remove members (only owners
    touch owners). People join by accepting an invitation (`/api/v1/invitations/`), never by being added.
    Removing a member revokes their tokens in the org and pauses the jobs and subscriptions they made."""

    model = Membership
    serializer_class = MembershipSerializer
    write_role = Role.ADMIN
    select_related = ("org", "user")
    filterset_fields = ["role"]
    http_method_names = ["get", "put", "patch", "delete", "head", "options"]

    def perform_update(self, serializer):
        if "role" in serializer.validated_data:
            serializer.instance = services.membership_set_role(principal=self.principal,
                                                               membership=serializer.instance,
                                                               role=serializer.validated_data["role"])

    def perform_destroy(self, instance):
        services.membership_remove(principal=self.principal, membership=instance)


class SignedInUser(permissions.BasePermission):
    """A person (a session, or a token a person holds), whatever their role: an invitation is answered by the
    one it names."""

    def has_permission(self, request, view) -> bool:
        principal = getattr(request, "principal", None)
        return principal is not None and principal.user_id is not None


class InvitationViewSet(TenantViewSet):
    """Invitations into your org (owners and admins invite, list and revoke; only owners offer owner) and the
    invitations addressed to you, which you accept or decline. Inviting answers the same for every username."""

    model = Invitation
    serializer_class = InvitationSerializer
    write_role = Role.ADMIN
    select_related = ("org",)
    filterset_fields = ["status"]
    http_method_names = ["get", "post", "head", "options"]

    def perform_create(self, serializer):
        data = serializer.validated_data
        serializer.instance = services.invitation_create(principal=self.principal, org=self.principal.org,
                                                         username=data["username"], role=data["role"])

    def _addressed(self, pk) -> Invitation:
        invitation = Invitation.objects.addressed_to(self.principal).filter(
            pk=int(pk) if str(pk).isdigit() else 0).first()
        if invitation is None:
            raise Http404
        return invitation

    @extend_schema(request=None, responses=MembershipSerializer)
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer, permission_classes=[SignedInUser])
    def accept(self, request, pk=None):
        membership = services.invitation_accept(user=request.user, invitation=self._addressed(pk))
        return Response(MembershipSerializer(membership).data)

    @extend_schema(request=None, responses=InvitationSerializer)
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer, permission_classes=[SignedInUser])
    def decline(self, request, pk=None):
        invitation = services.invitation_decline(user=request.user, invitation=self._addressed(pk))
        return Response(InvitationSerializer(invitation).data)

    @extend_schema(request=None, responses=InvitationSerializer)
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def revoke(self, request, pk=None):
        invitation = services.invitation_revoke(principal=self.principal, invitation=self.get_object())
        return Response(InvitationSerializer(invitation).data)
