"""Fleets API: thin viewsets over apps.fleets.services."""

from __future__ import annotations

import time

from django.core.cache import cache
from django.db import transaction
from django.shortcuts import get_object_or_404
from drf_spectacular.utils import extend_schema
from rest_framework import permissions, status
from rest_framework.decorators import action
from rest_framework.exceptions import PermissionDenied
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.balancers.models import Listener, LoadBalancer
from apps.core.api.serializers import EmptySerializer, QueuedSerializer
from apps.core.api.throttles import PARK_HEADER, RELEASE_HEADER, PrincipalRateThrottle, park_slot, wait_slot
from apps.core.api.viewsets import TenantViewSet, etag_for
from apps.core.errors import DomainError, NotFoundError
from apps.fleets import selectors, services
from apps.fleets.api import serializers as s
from apps.fleets.config import certificates as certs
from apps.fleets.config import preview, route_tester
from apps.fleets.health.collect import health_cache_key
from apps.fleets.health.vips import listener_vip
from apps.fleets.models import (
    REVISION_BULK_FIELDS,
    Certificate,
    ConfigRevision,
    Fleet,
    Node,
    NodeHealth,
    Rollout,
    revision_deferred,
)

APPLIED_MAX_TIMEOUT_S = 60.0
APPLIED_POLL_S = 0.05


class FleetViewSet(TenantViewSet):
    """Fleet infrastructure: operators read and write it; anyone else finds nothing (404)."""

    model = Fleet
    operator_only_write = True
    serializer_class = s.FleetSerializer
    select_related = ("region",)
    prefetch_related = ("serves",)
    filterset_fields = ["name", "region__slug"]

    def perform_create(self, serializer):
        serializer.instance = services.fleet_save(principal=self.principal, fleet=Fleet(),
                                                  data=serializer.validated_data)

    def perform_update(self, serializer):
        services.fleet_save(principal=self.principal, fleet=serializer.instance, data=serializer.validated_data)

    def perform_destroy(self, instance):
        services.fleet_delete(principal=self.principal, fleet=instance)

    @extend_schema(request=None, responses={202: QueuedSerializer})
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def reconcile(self, request, pk=None):
        """Render the desired state now and roll it out if it changed (asynchronously)."""
        fleet = self.get_object()
        services.fleet_push(fleet=fleet, principal=self.principal, full=True)
        return Response({"queued": True}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={200: s.FleetSerializer})
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer, url_path="confirm-restore")
    def confirm_restore(self, request, pk=None):
        """The nodes serve revisions this database does not know (it was restored from an older backup): replace
        them with this database's state, as `restore_hold.would_change` shows. Nothing to confirm: no change."""
        fleet = services.fleet_restore_confirm(fleet=self.get_object(), principal=self.principal)
        return Response(s.FleetSerializer(fleet, context=self.get_serializer_context()).data)

    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def converge(self, request, pk=None):
        """Check drift now and re-converge drifted nodes and nodes that came back."""
        fleet = self.get_object()
        report = services.fleet_drift_report(fleet=fleet)
        rollout = services.fleet_converge(fleet=fleet, check_drift=False)
        drifted = list(fleet.nodes.filter(status=Node.Status.DRIFTED).values_list("name", flat=True))
        data = {"drifted": drifted, "repaired": report.repaired, "detail": report.summary(),
                "rollout": s.RolloutSerializer(rollout, context=self.get_serializer_context()).data
                if rollout else None}
        return Response(data, status=status.HTTP_202_ACCEPTED if rollout else status.HTTP_200_OK)

    @extend_schema(responses={200: s.FleetHealthSerializer})
    @action(detail=True, methods=["get"])
    def health(self, request, pk=None):
        """The hot copy of `show stat` per node (cache first, database rows otherwise)."""
        fleet = self.get_object()
        summary = cache.get(health_cache_key(fleet.pk))
        if summary is None:
            rows = NodeHealth.objects.filter(node__fleet=fleet).select_related("node")
            summary = {"collected_at": None, "nodes": {}}
            for row in rows:
                entry = summary["nodes"].setdefault(row.node.name, {"reachable": True, "servers": []})
                if row.server not in ("FRONTEND", "BACKEND"):
                    entry["servers"].append({"backend": row.proxy, "server": row.server, "status": row.status,
                                             "check": row.check_status, "weight": row.weight,
                                             "rate": row.rate_per_s})
        return Response(s.FleetHealthSerializer(summary).data)


class NodeViewSet(TenantViewSet):
    model = Node
    operator_only_write = True
    serializer_class = s.NodeSerializer
    select_related = ("fleet", "applied_revision")
    filterset_fields = ["fleet", "status", "transport", "enabled"]

    def get_queryset(self):
        return super().get_queryset().defer(*revision_deferred("applied_revision"))

    def perform_create(self, serializer):
        serializer.instance = services.node_save(principal=self.principal, node=Node(),
                                                 data=serializer.validated_data)

    def perform_update(self, serializer):
        services.node_save(principal=self.principal, node=serializer.instance, data=serializer.validated_data)

    def perform_destroy(self, instance):
        services.node_delete(principal=self.principal, node=instance)


class ConfigRevisionViewSet(TenantViewSet):
    model = ConfigRevision
    operator_only_write = True
    select_related = ("fleet",)
    filterset_fields = ["fleet", "number", "validation_ok"]
    ordering_fields = ["number", "created_at"]
    http_method_names = ["get", "head", "options"]

    def get_queryset(self):
        # Megabytes each at 100k routes: the snapshot is never answered, the text, diff and check output only by
        # the detail (ConfigRevisionDetailSerializer).
        bulk = ("snapshot",) if self.action == "retrieve" else REVISION_BULK_FIELDS
        return super().get_queryset().defer(*bulk)

    def get_serializer_class(self):
        return s.ConfigRevisionDetailSerializer if self.action == "retrieve" else s.ConfigRevisionSerializer


class RolloutViewSet(TenantViewSet):
    """Operators create rollouts and roll back; customers read those of fleets serving their LBs."""

    model = Rollout
    serializer_class = s.RolloutSerializer
    select_related = ("fleet", "revision")
    prefetch_related = ("results__node",)
    filterset_fields = ["fleet", "status", "kind"]
    http_method_names = ["get", "post", "head", "options"]
    operator_only_write = True

    def get_queryset(self):
        return super().get_queryset().defer(*revision_deferred("revision"))  # its number only

    def _create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        fleet = data["fleet"]
        if "revision" in data:
            revision = ConfigRevision.objects.filter(fleet=fleet, number=data["revision"]).first()
            if revision is None:
                raise NotFoundError(f"Fleet {fleet.name} has no revision {data['revision']}.", field="revision")
        else:
            revision = services.fleet_render(fleet=fleet, reason=f"rollout requested by {self.principal.actor}")
        with transaction.atomic():
            kind = Rollout.Kind.ROLLBACK if revision.number < fleet.desired_revision else Rollout.Kind.DEPLOY
            rollout = services.rollout_create(fleet=fleet, revision=revision, principal=self.principal,
                                              kind=kind, canary=data.get("canary"),
                                              batch_size=data.get("batch_size"))
        out = self.get_serializer(rollout).data
        return Response(out, status=status.HTTP_201_CREATED, headers={"ETag": etag_for(out)})

    @extend_schema(request=None, responses={201: s.RolloutSerializer})
    @action(detail=True, methods=["post"], serializer_class=EmptySerializer)
    def rollback(self, request, pk=None):
        """Put the fleet back on the revision it served before this rollout."""
        if not self.principal.is_operator:
            raise PermissionDenied("Only operators roll fleets back.")
        rollout = self.get_object()
        new = services.rollout_rollback(rollout=rollout, principal=self.principal)
        data = s.RolloutSerializer(new, context=self.get_serializer_context()).data
        return Response(data, status=status.HTTP_201_CREATED)


class CertificateViewSet(TenantViewSet):
    model = Certificate
    serializer_class = s.CertificateSerializer
    select_related = ("org",)
    filterset_fields = ["name"]

    def _save(self, serializer, cert: Certificate) -> Certificate:
        data = serializer.validated_data
        return certs.certificate_save(
            principal=self.principal, cert=cert,
            org=data.get("org") or (cert.org if cert.pk else self.principal.org),
            name=data.get("name", cert.name), cert_pem=data.get("cert_pem"), key_pem=data.get("key_pem"),
            chain_pem=data.get("chain_pem", ""))

    def perform_create(self, serializer):
        serializer.instance = self._save(serializer, Certificate())

    def perform_update(self, serializer):
        self._save(serializer, serializer.instance)

    def perform_destroy(self, instance):
        certs.certificate_delete(principal=self.principal, cert=instance)


# --- load balancer endpoints ----------------------------------------------------------------------------


class HasPrincipal(permissions.BasePermission):
    def has_permission(self, request, view) -> bool:
        return getattr(request, "principal", None) is not None


def _visible_lb(request, pk: int) -> LoadBalancer:
    return get_object_or_404(LoadBalancer.objects.visible_to(request.principal), pk=pk)


def _visible_lb_and_query(request, pk: int, serializer_class) -> tuple[LoadBalancer, dict]:
    """The LB (404 when not visible) and the validated query string (400 with codes otherwise)."""
    lb = _visible_lb(request, pk)
    query = serializer_class(data=request.query_params)
    query.is_valid(raise_exception=True)
    return lb, query.validated_data


class LoadBalancerPreviewView(APIView):
    """POST /load-balancers/{id}/preview/: the rendered diff of the next rollout; nothing is pushed."""

    permission_classes = [HasPrincipal]
    serializer_class = EmptySerializer
    throttle_classes = [PrincipalRateThrottle]
    throttle_scope = "preview"  # runs haproxy -c

    def post(self, request, pk: int):
        lb = _visible_lb(request, pk)
        return Response({"load_balancer": lb.pk, "revision": lb.revision,
                         "fleets": preview.lb_preview(lb=lb, principal=request.principal)})


class ListenerVipView(APIView):
    """GET /listeners/{id}/vip/: VIP -> holder node -> health, read from the nodes now (over SSH for SSH
    nodes), per fleet serving the listener's LB. The LB's owner and operators only; others get 404."""

    permission_classes = [HasPrincipal]
    serializer_class = s.ListenerVipSerializer

    @extend_schema(responses={200: s.ListenerVipSerializer})
    def get(self, request, pk: int):
        principal = request.principal
        listener = get_object_or_404(Listener.objects.visible_to(principal).select_related("lb", "static_ip"), pk=pk)
        if not principal.is_operator and listener.lb.org_id != principal.org_id:
            raise NotFoundError("No listener matches the given query.")
        address = listener.static_ip.address if listener.static_ip_id else None
        data = {"listener": listener.pk, "address": address, "fleets": listener_vip(listener)}
        return Response(s.ListenerVipSerializer(data).data)


class LoadBalancerRouteTestView(APIView):
    """GET /load-balancers/{id}/route-test/?host=H&path=P[&method=M]: which route, pool and region serve
    that request, and why (apps.fleets.config.route_tester; the renderer's own routing rule)."""

    permission_classes = [HasPrincipal]
    serializer_class = s.RouteTestQuerySerializer

    def get(self, request, pk: int):
        lb, query = _visible_lb_and_query(request, pk, s.RouteTestQuerySerializer)
        return Response({"load_balancer": lb.pk, **route_tester.route_test(
            lb=lb, principal=request.principal, **query)})


class LoadBalancerAppliedView(APIView):
    """GET /load-balancers/{id}/applied/?revision=N&timeout=S: wait until every node serves it.

    200 once every enabled node of every fleet serving the LB runs a verified config covering LB
    revision N (or later); 202 with per-node state when `timeout` seconds (at most 60) pass first.
    """

    permission_classes = [HasPrincipal]
    serializer_class = s.AppliedQuerySerializer
    throttle_classes = [PrincipalRateThrottle]
    throttle_scope = "longpoll"

    def get_throttles(self):
        # A parked long-poll's re-checks (controlplane.asgi) are one client request, charged once.
        return [] if self.request.META.get("spillway.park") == "recheck" else super().get_throttles()

    @extend_schema(parameters=[s.AppliedQuerySerializer],
                   responses={200: s.AppliedSerializer, 202: s.AppliedSerializer})
    def get(self, request, pk: int):
        lb, query = _visible_lb_and_query(request, pk, s.AppliedQuerySerializer)
        wanted = query["revision"]
        timeout_s = min(query["timeout"], APPLIED_MAX_TIMEOUT_S)
        if not selectors.lb_fleets(lb).exists():
            raise DomainError("no_fleet", "This load balancer is not served by any HAProxy fleet.", status=409)
        # Set by controlplane.asgi (never by a client: headers only become HTTP_* keys).
        park = request.META.get("spillway.park")
        if park is not None:
            return self._answer_or_park(request, lb, wanted, timeout_s)
        with wait_slot(request.principal) as may_wait:
            # Without a slot the caller gets the state now, as if its timeout had passed.
            deadline = time.monotonic() + (timeout_s if may_wait else 0.0)
            while True:
                done, nodes = selectors.lb_applied_state(lb, wanted)
                if done or time.monotonic() >= deadline:
                    break
                time.sleep(APPLIED_POLL_S)
        return self._answer(lb, wanted, done, nodes, {} if may_wait else {"Retry-After": "1"})

    def _answer_or_park(self, request, lb: LoadBalancer, wanted: int, timeout_s: float) -> Response:
        """Under controlplane.asgi: answer now, or ask to park (no thread waits; see that module)."""
        done, nodes = selectors.lb_applied_state(lb, wanted)
        if done:
            return self._answer(lb, wanted, done, nodes, {})
        if request.META["spillway.park"] == "recheck":  # still parked: keep waiting, its slot is held
            return self._answer(lb, wanted, done, nodes, {PARK_HEADER: "0"})
        if timeout_s <= 0:
            return self._answer(lb, wanted, done, nodes, {})
        key = park_slot(request.principal)
        if key is None:  # this principal already has its share of waiting long-polls
            return self._answer(lb, wanted, done, nodes, {"Retry-After": "1"})
        return self._answer(lb, wanted, done, nodes, {PARK_HEADER: f"{timeout_s:g}", RELEASE_HEADER: key})

    def _answer(self, lb: LoadBalancer, wanted: int, done: bool, nodes: list, headers: dict[str, str]) -> Response:
        if not self.request.principal.is_operator:
            # A customer learns how far each node got, not the operator's node names.
            nodes = [{**n, "node": f"node {i}"} for i, n in enumerate(nodes, start=1)]
        body = {"load_balancer": lb.pk, "revision": wanted, "current_revision": lb.revision,
                "applied": done, "nodes": nodes}
        if done:
            return Response(body)
        # Retry-After: told not to wait (no slot free), a polite client comes back a second later.
        return Response(body, status=status.HTTP_202_ACCEPTED, headers=headers)
