"""Golden signals API: a chart's points and change markers for an LB, route, pool, member or node."""

from __future__ import annotations

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import DomainError, NotFoundError
from apps.signals import selectors


def chart_payload(principal, scope: str, pk: str, range_name: str) -> dict:
    """The chart of `scope` `pk` over `range_name` (the API's answer and the UI's data block alike)."""
    if scope not in selectors.SCOPES:
        raise DomainError("invalid_scope", f"scope must be one of {', '.join(selectors.SCOPES)}.", field="scope")
    if not str(pk).isdigit():
        raise DomainError("id_required", "Give ?id=<object id>.", field="id")
    if range_name not in selectors.RANGES:
        raise DomainError("invalid_range", f"range must be one of {', '.join(selectors.RANGES)}.", field="range")
    target = selectors.target(principal, scope, int(pk))
    if target is None:
        raise NotFoundError(f"No such {scope}.")
    payload = selectors.series(target, range_name)
    payload["markers"] = selectors.markers(target, principal, range_name)
    if scope == "pool":
        payload["members"] = selectors.by_member(target.obj, principal, range_name)
    return payload


class SignalsView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("scope", str, required=True, enum=list(selectors.SCOPES)),
            OpenApiParameter("id", int, required=True, description="The object's id."),
            OpenApiParameter("range", str, enum=list(selectors.RANGES), description="Default 5m."),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request):
        """Request rate by status class (HAProxy's own 5xx apart from the backend's), latency p50/p95/p99
        (queue, connect, upstream = to the backend's first byte, total), retries and redispatches, per point,
        with the changes that can have moved them (who did what)."""
        q = request.query_params
        return Response(chart_payload(request.principal, q.get("scope", ""), q.get("id", ""), q.get("range", "5m")))
