"""Golden signals API: a chart's points and change markers for an LB, route, pool, member or node."""

from __future__ import annotations

import math

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.core.errors import DomainError, NotFoundError
from apps.signals import impact, sampling, selectors, services


def chart_payload(principal, scope: str, pk: str, range_name: str) -> dict:
    """The chart of `scope` `pk` over `range_name` (the API's answer and the UI's data block alike)."""
    if scope not in selectors.SCOPES:
        raise DomainError("invalid_scope", f"scope must be one of {', '.join(selectors.SCOPES)}.", field="scope")
    if not _is_id(pk):
        raise DomainError("id_required", "Give ?id=<object id>.", field="id")
    if range_name not in selectors.RANGES:
        raise DomainError("invalid_range", f"range must be one of {', '.join(selectors.RANGES)}.", field="range")
    target = selectors.target(principal, scope, int(pk))
    if target is None:
        raise NotFoundError(f"No such {scope}.")
    members: dict = {}
    payload = selectors.series(target, range_name, by_ref=members if scope == "pool" else None)
    payload["markers"] = selectors.markers(target, principal, range_name)
    if scope == "pool":
        payload["members"] = selectors.by_member(target.obj, range_name, members)
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


class ChangeImpactView(APIView):
    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request, pk: int):
        """A change (an audit event) and its effect: the changed object's requests, 5xx share and p99 latency in
        the 5 minutes before against the 5 minutes after, flagged when either rose past the fleet's guards
        (guard_5xx_rise_pct, guard_p99_rise_ms), with the chart of those 10 minutes."""
        payload = impact.change_payload(request.principal, pk)
        if payload is None:
            raise NotFoundError("No such change.")
        return Response(payload)


def _is_id(raw: object) -> bool:
    text = str(raw)
    return text.isascii() and text.isdigit() and len(text) <= 12


def _number(raw: str | None, field: str, cast=float):
    """A query parameter as a finite number within the years a timestamp can name; None when absent."""
    if raw in (None, ""):
        return None
    try:
        value = cast(raw) if str(raw).isascii() and len(str(raw)) <= 24 else None
    except ValueError:
        value = None
    if value is None or not math.isfinite(value) or abs(value) > 1e11:
        raise DomainError(f"invalid_{field}", f"{field} must be a number (unix seconds for times).", field=field)
    return value


def requests_payload(principal, params) -> dict:
    """The sampled requests behind a chart (the API's answer and the UI's table alike)."""
    scope, pk = params.get("scope", ""), params.get("id", "")
    if scope not in selectors.SCOPES:
        raise DomainError("invalid_scope", f"scope must be one of {', '.join(selectors.SCOPES)}.", field="scope")
    if not _is_id(pk):
        raise DomainError("id_required", "Give ?id=<object id>.", field="id")
    try:
        found = selectors.sampled_requests(
            principal, scope, int(pk), status=params.get("status", ""), region=params.get("region", ""),
            node=params.get("node", ""), since=_number(params.get("since"), "since"),
            until=_number(params.get("until"), "until"), limit=_number(params.get("limit"), "limit", int) or 50)
    except selectors.BadFilter as exc:
        raise DomainError(exc.code, str(exc), field=exc.field) from None
    if found is None:
        raise NotFoundError(f"No such {scope}.")
    return {"scope": scope, "id": int(pk), "requests": found, "sampled": {
        "errors_per_s": sampling.ERRORS_PER_S, "others_per_s": sampling.OTHERS_PER_S,
        "kept_s": int(services.SAMPLE_KEEP.total_seconds())}}


class SampledRequestsView(APIView):
    @extend_schema(
        parameters=[
            OpenApiParameter("scope", str, required=True, enum=list(selectors.SCOPES)),
            OpenApiParameter("id", int, required=True),
            OpenApiParameter("status", str, description="A class (5xx), a code (503) or `failed`."),
            OpenApiParameter("region", str), OpenApiParameter("node", str, description="Operators only."),
            OpenApiParameter("since", float, description="Unix seconds."), OpenApiParameter("until", float),
            OpenApiParameter("limit", int, description=f"At most {selectors.SAMPLE_LIMIT_MAX}; default 50."),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request):
        """Sampled requests as the nodes logged them, newest first: each LB keeps its first failed requests of
        every second and a few others (sampled.errors_per_s, others_per_s), for sampled.kept_s seconds."""
        return Response(requests_payload(request.principal, request.query_params))
