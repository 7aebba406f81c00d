"""Traffic API: observed overflow per pool and region, and the what-if planner."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import permissions, serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.balancers.models import Pool
from apps.core.errors import DomainError, NotFoundError
from apps.traffic import selectors, services


class PrincipalRequired(permissions.BasePermission):
    """Any principal: the what-if is a POST only because it carries a body; it changes nothing."""

    def has_permission(self, request, view) -> bool:
        return getattr(request, "principal", None) is not None


class _CapacitySerializer(serializers.Serializer):
    region = serializers.CharField()
    healthy_members = serializers.IntegerField(required=False, min_value=0)
    max_rate_per_member = serializers.FloatField(required=False, allow_null=True, min_value=0)
    capacity_scaler = serializers.FloatField(required=False, min_value=0, max_value=1)


class WhatIfRequestSerializer(serializers.Serializer):
    """Documentation of the body; services.what_if validates it (errors carry stable codes)."""

    pool = serializers.IntegerField(required=False, allow_null=True, help_text="Start from this pool (null: none).")
    policy = serializers.ChoiceField(choices=["waterfall", "isolation"], required=False, allow_null=True,
                                     help_text="null: the pool's own policy (waterfall without a pool).")
    capacities = _CapacitySerializer(many=True, required=False)
    demand = serializers.DictField(child=serializers.FloatField(min_value=0), required=False)


class OverflowView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("pool", int, required=True, description="Pool id."),
            OpenApiParameter("window", str, description="30s, 5m (default), 6h, 7d ... up to 30d."),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request):
        """Observed traffic of one pool per region: demand, local, out (to where), in, capacity,
        utilization over the window, plus the plan and what the rendered chains should serve."""
        pool_id = request.query_params.get("pool", "")
        if not pool_id.isdigit():
            raise DomainError("pool_required", "Give ?pool=<id>.", field="pool")
        try:
            window_s = selectors.parse_window(request.query_params.get("window", "5m"))
        except selectors.WindowError as exc:
            raise DomainError("invalid_window", str(exc), field="window") from exc
        pool = Pool.objects.visible_to(request.principal).select_related("lb").filter(pk=int(pool_id)).first()
        if pool is None:
            raise NotFoundError("No such pool.")
        return Response(selectors.observed_overflow(pool, window_s))


class WhatIfView(APIView):
    permission_classes = [PrincipalRequired]

    @extend_schema(request=WhatIfRequestSerializer, responses={200: OpenApiTypes.OBJECT})
    def post(self, request):
        """Plan proposed capacities and/or demand; nothing is changed or pushed."""
        if not isinstance(request.data, dict):
            raise DomainError("invalid", "The body must be a JSON object.")
        return Response(services.what_if(principal=request.principal, data=dict(request.data)))
