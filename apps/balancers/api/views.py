"""Balancers API: thin viewsets over the services."""

from __future__ import annotations

from django.db.models import Count, Q
from django.http import Http404
from django_filters import rest_framework as filters
from drf_spectacular.utils import extend_schema
from rest_framework import status
from rest_framework.decorators import action
from rest_framework.response import Response

from apps.audit.services import AuditAction
from apps.balancers import changes, services
from apps.balancers.api import serializers as s
from apps.balancers.models import (
    HostnameClaim,
    IpPool,
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Region,
    RegionDistance,
    Route,
    StaticIP,
)
from apps.core.api.schema import IDEMPOTENCY_KEY
from apps.core.api.serializers import EmptySerializer
from apps.core.api.viewsets import TenantViewSet, etag_for


class GlobalQuerySetMixin:
    """Shared infrastructure (regions, IP pools): readable by all, written by operators."""

    operator_only_write = True


class ServiceWritesMixin:
    """Plain objects: create/update/delete through the generic audited service."""

    def perform_create(self, serializer):
        serializer.instance = services.object_save(principal=self.principal, obj=self.model(),
                                                   action=AuditAction.CREATE, data=serializer.validated_data)

    def perform_update(self, serializer):
        services.object_save(principal=self.principal, obj=serializer.instance, action=AuditAction.UPDATE,
                             data=serializer.validated_data)

    def perform_destroy(self, instance):
        services.object_delete(principal=self.principal, obj=instance)


class RegionViewSet(GlobalQuerySetMixin, ServiceWritesMixin, TenantViewSet):
    model = Region
    serializer_class = s.RegionSerializer
    filterset_fields = ["slug"]


class RegionDistanceViewSet(GlobalQuerySetMixin, ServiceWritesMixin, TenantViewSet):
    model = RegionDistance
    serializer_class = s.RegionDistanceSerializer
    select_related = ("src", "dst")


class LoadBalancerFilter(filters.FilterSet):
    class Meta:
        model = LoadBalancer
        fields = ["kind", "shared", "fleet", "name"]


class LoadBalancerViewSet(ServiceWritesMixin, TenantViewSet):
    """Load balancers you can see: your own, and the operator's shared ones your routes ride on."""

    model = LoadBalancer
    serializer_class = s.LoadBalancerSerializer
    select_related = ("org",)
    filterset_class = LoadBalancerFilter
    ordering_fields = ["name", "created_at", "revision"]

    @extend_schema(responses=s.LbChangeSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=s.LbChangeSerializer, pagination_class=None)
    def changes(self, request, pk=None):
        """The LB's recent changes you can see (newest first), who made them and what they changed."""
        return Response(s.LbChangeSerializer(changes.lb_changes(lb=self.get_object(), principal=self.principal),
                                             many=True).data)

    @extend_schema(request=s.RevertRequestSerializer, responses=s.RevertedSerializer)
    @action(detail=True, methods=["post"], serializer_class=s.RevertRequestSerializer)
    def revert(self, request, pk=None):
        """Revert one change of this LB on every fleet that serves it: the inverse is written as a new change
        (a new LB revision); drains and weights set since stay, and the answer says so."""
        # Visible is enough: a tenant reverts its own route on a shared LB; each object is checked for change.
        lb = self.get_queryset().filter(pk=int(pk) if str(pk).isdigit() else 0).first()
        if lb is None:
            raise Http404
        body = s.RevertRequestSerializer(data=request.data, context={"request": request})
        body.is_valid(raise_exception=True)
        result = changes.change_revert(principal=self.principal, lb=lb, event_id=body.validated_data["change"])
        return Response({"reverted": result.sentence(), "done": result.done, "kept": result.kept})


class ListenerViewSet(ServiceWritesMixin, TenantViewSet):
    model = Listener
    serializer_class = s.ListenerSerializer
    select_related = ("lb", "static_ip")
    filterset_fields = ["lb", "protocol", "port"]

    def perform_create(self, serializer):
        serializer.instance = services.listener_save(principal=self.principal, listener=Listener(),
                                                     data=serializer.validated_data)

    def perform_update(self, serializer):
        services.listener_save(principal=self.principal, listener=serializer.instance,
                               data=serializer.validated_data)


class PoolViewSet(ServiceWritesMixin, TenantViewSet):
    model = Pool
    serializer_class = s.PoolSerializer
    select_related = ("lb", "org")
    prefetch_related = ("regions__region",)
    filterset_fields = ["lb", "name", "algorithm", "overflow_policy"]

    def perform_create(self, serializer):
        serializer.instance = services.pool_create(principal=self.principal, data=serializer.validated_data)


class PoolRegionViewSet(ServiceWritesMixin, TenantViewSet):
    model = PoolRegion
    serializer_class = s.PoolRegionSerializer
    select_related = ("pool", "region")
    filterset_fields = ["pool", "region"]


class MemberViewSet(ServiceWritesMixin, TenantViewSet):
    model = Member
    serializer_class = s.MemberSerializer
    select_related = ("pool", "region")
    filterset_fields = ["pool", "region", "admin_state"]

    def perform_create(self, serializer):
        serializer.instance = services.member_create(principal=self.principal, data=serializer.validated_data)

    @action(detail=True, methods=["post"], serializer_class=s.MemberStateSerializer)
    def state(self, request, pk=None):
        """Drain / maint / ready and weight, applied through the runtime API without a reload."""
        member = self.get_object()
        serializer = s.MemberStateSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        services.member_set_state(principal=self.principal, member=member, **serializer.validated_data)
        data = s.MemberSerializer(member, context=self.get_serializer_context()).data
        return Response(data, headers={"ETag": etag_for(data)})


class RouteViewSet(TenantViewSet):
    model = Route
    serializer_class = s.RouteSerializer
    select_related = ("lb", "org")
    prefetch_related = ("targets",)
    filterset_fields = ["lb", "path_match", "priority"]
    ordering_fields = ["priority", "created_at"]
    # route_save is one transaction, under the LB's lock: a savepoint in ours was two more round trips held there.
    create_in_transaction = False

    def _save(self, serializer, route: Route):
        return services.route_save(principal=self.principal, route=route, data=serializer.validated_data)

    def perform_create(self, serializer):
        serializer.instance = self._save(serializer, Route())

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance)

    def perform_destroy(self, instance):
        services.object_delete(principal=self.principal, obj=instance)


class HostnameClaimViewSet(ServiceWritesMixin, TenantViewSet):
    model = HostnameClaim
    serializer_class = s.HostnameClaimSerializer
    select_related = ("org",)
    filterset_fields = ["status", "hostname"]
    http_method_names = ["get", "post", "delete", "head", "options"]

    def perform_create(self, serializer):
        serializer.instance = services.hostname_claim_create(
            principal=self.principal, org=serializer.validated_data["org"],
            hostname=serializer.validated_data["hostname"])

    def perform_destroy(self, instance):
        services.hostname_claim_delete(principal=self.principal, claim=instance)

    def _decide(self, approve: bool):
        claim = self.get_object()
        services.hostname_claim_decide(principal=self.principal, claim=claim, approve=approve)
        return Response(s.HostnameClaimSerializer(claim, context=self.get_serializer_context()).data)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def approve(self, request, pk=None):
        return self._decide(True)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def reject(self, request, pk=None):
        return self._decide(False)


class IpPoolViewSet(GlobalQuerySetMixin, ServiceWritesMixin, TenantViewSet):
    model = IpPool
    serializer_class = s.IpPoolSerializer

    select_related = ("region",)

    def scope_queryset(self, qs):
        # An aggregate drops Meta.ordering (Django 3.1+), and pages of an unordered list can repeat rows.
        return qs.annotate(
            used_count=Count("addresses", filter=~Q(addresses__state=StaticIP.State.FREE))
        ).order_by("name", "pk")


class StaticIPViewSet(TenantViewSet):
    model = StaticIP
    serializer_class = s.StaticIPSerializer
    select_related = ("pool", "org")
    filterset_fields = ["state", "pool__name", "address"]
    http_method_names = ["get", "post", "head", "options"]

    def scope_queryset(self, qs):
        return qs.exclude(state=StaticIP.State.FREE)

    @extend_schema(responses={201: s.StaticIPSerializer}, parameters=[IDEMPOTENCY_KEY])
    @action(detail=False, methods=["post"], serializer_class=s.StaticIPAllocateSerializer)
    def allocate(self, request):
        return self.create(request)  # same Idempotency-Key handling as any POST

    def _create(self, request, *args, **kwargs):
        serializer = s.StaticIPAllocateSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        org = serializer.validated_data.get("org") or self.principal.org
        ip = services.static_ip_allocate(principal=self.principal, pool=serializer.validated_data["pool"], org=org,
                                         address=serializer.validated_data.get("address"))
        return Response(s.StaticIPSerializer(ip).data, status=status.HTTP_201_CREATED)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def release(self, request, pk=None):
        ip = services.static_ip_release(principal=self.principal, ip=self.get_object())
        return Response(s.StaticIPSerializer(ip).data)

