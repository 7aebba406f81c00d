"""Config as code over the API: GET /export/?org=, POST /apply/?org= (dry_run → the plan only)."""

from __future__ import annotations

from typing import Any

import yaml
from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from apps.accounts.models import Organization
from apps.configcode import document, parse, services
from apps.configcode.selectors import org_export
from apps.core import produced
from apps.core.api.errors import ApiError
from apps.core.api.serializers import StrictSerializer
from apps.core.tenancy import Action, restricted


def _org(request) -> Organization:
    """`?org=<slug>`, default the caller's own; another tenant's org answers like a missing one."""
    slug = request.query_params.get("org") or request.principal.org.slug
    org = restricted(Organization, request.principal, Action.VIEW).filter(slug=slug).first()
    if org is None:
        raise ApiError("not_found", "No such organization.", 404)
    return org


def load(text: str | bytes) -> Any:
    """A document from YAML or JSON text (JSON is YAML), bounded while it is read (apps.configcode.parse)."""
    try:
        return parse.load(text)
    except parse.ParseRefused as exc:
        raise document.DocumentError(exc.code, exc.message) from None


class _NoAliases(yaml.SafeDumper):
    """Our own parser refuses anchors (a YAML bomb's tool): never write one, even for a value used twice."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump_yaml(doc: dict[str, Any]) -> str:
    return yaml.dump(doc, Dumper=_NoAliases, sort_keys=False, default_flow_style=False, allow_unicode=True)


class ApplyRequest(StrictSerializer):
    document = serializers.JSONField(help_text="The document (as exported), or its YAML text.")
    dry_run = serializers.BooleanField(default=False)


class ExportView(APIView):
    """One document of the org's LBs, listeners, pools, members, routes, capacity tests and jobs.

    `?output=yaml` for YAML (default JSON). The `etag` field (also the ETag header) is what an apply
    must send back as If-Match.
    """

    @extend_schema(parameters=[OpenApiParameter("org", str), OpenApiParameter("output", str, enum=["json", "yaml"])],
                   responses={(200, "application/json"): OpenApiTypes.OBJECT,
                              (200, "application/yaml"): OpenApiTypes.OBJECT})  # the same document
    def get(self, request):
        output = request.query_params.get("output", "json")
        if output not in ("json", "yaml"):
            raise ApiError("invalid", "output must be json or yaml.", fields={"output": ["Not json or yaml."]})
        doc = org_export(_org(request))
        headers = {"ETag": f'"{doc["etag"]}"'}
        if output == "yaml":
            return HttpResponse(dump_yaml(doc), content_type="application/yaml", headers=headers)
        return Response(doc, headers=headers)


class ApplyView(APIView):
    """Plan (`dry_run: true`) or apply a document, all-or-nothing, guarded by If-Match (the export's etag)."""

    serializer_class = ApplyRequest
    error_statuses = (412, 428)  # If-Match stale, or missing on a real apply
    max_body_bytes = 2 * parse.MAX_BYTES  # a large org's document, as YAML text inside JSON (escapes grow it)

    def initial(self, request, *args, **kwargs):
        produced.start()  # an apply answers the revision of every LB it changed
        super().initial(request, *args, **kwargs)

    def finalize_response(self, request, response, *args, **kwargs):
        response = super().finalize_response(request, response, *args, **kwargs)
        produced.stamp(response, produced.take())
        return response

    @extend_schema(parameters=[OpenApiParameter("org", str)], request=ApplyRequest,
                   responses={200: OpenApiTypes.OBJECT})
    def post(self, request):
        body = ApplyRequest(data=request.data)
        body.is_valid(raise_exception=True)
        org = _org(request)
        raw = body.validated_data["document"]
        try:
            doc = load(raw) if isinstance(raw, str) else raw
            parse.check_plain(doc)
            if body.validated_data["dry_run"]:
                current, changes = services.org_plan(org=org, doc=doc)
                return Response({"dry_run": True, "applied": False, "etag": current["etag"],
                                 "changes": [c.as_dict() for c in changes]})
            changes = services.org_apply(request=request, org=org, doc=doc, if_match=request.headers.get("If-Match"))
        except (document.DocumentError, parse.ParseRefused) as exc:
            raise ApiError(exc.code, exc.message) from None
        return Response({"dry_run": False, "applied": True, "etag": org_export(org)["etag"],
                         "changes": [c.as_dict() for c in changes]})
