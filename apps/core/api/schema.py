"""The OpenAPI generator of the API: what every operation can answer, said once for all of them.

drf-spectacular documents only the success body. Integrators generate clients from the schema, so
here every operation also documents its error answers (the `{"code","detail","fields"}` body) and
the headers the base viewset honours: `If-Match` on writes to an object (412 when stale),
`Idempotency-Key` on creates (422 when reused with another body), `ETag` on what they answer.
Actions that answer another status than 200 say so with `extend_schema(responses={202: ...})`.
"""

from __future__ import annotations

from drf_spectacular import openapi
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter

from apps.core.api.serializers import ErrorSerializer

_WRITES = {"POST", "PUT", "PATCH", "DELETE"}
_OBJECT_WRITES = {"update", "partial_update", "destroy"}

IF_MATCH = OpenApiParameter(
    "If-Match", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    description="The ETag you read; the write is refused with 412 if the object changed since.")
IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key", OpenApiTypes.STR, OpenApiParameter.HEADER, required=False,
    pattern=r"^[A-Za-z0-9_.:-]{1,128}$",
    description="Retry-safe create: the same key and body answer the first response again; "
                "the same key with another body is a 422.")
ETAG = OpenApiParameter("ETag", OpenApiTypes.STR, OpenApiParameter.HEADER, response=[200, 201],
                        description="Version of the object; send it back in If-Match.")


class AutoSchema(openapi.AutoSchema):
    def _tenant_view(self) -> bool:
        from apps.core.api.viewsets import TenantViewSet

        return isinstance(self.view, TenantViewSet)

    def get_override_parameters(self):
        params = list(super().get_override_parameters())
        if self._tenant_view():
            action = getattr(self.view, "action", None)
            if action in _OBJECT_WRITES:
                params.append(IF_MATCH)
            if action == "create":  # actions that create through `create` add it with extend_schema
                params.append(IDEMPOTENCY_KEY)
            if action in ("retrieve", "update", "partial_update", "create"):
                params.append(ETAG)
        return params

    def _get_response_bodies(self, direction="response"):
        responses = super()._get_response_bodies(direction)
        if direction != "response":
            return responses
        for code in self._error_codes():
            if str(code) not in responses:
                responses[str(code)] = self._get_response_for_code(ErrorSerializer, str(code), direction=direction)
        # Refused by the web server before the application sees the request, so not the JSON error body.
        responses.setdefault("414", {"description": "Request line (path and query) too long; plain text from "
                                                    "the web server."})
        return responses

    def _error_codes(self) -> list[int]:
        action = getattr(self.view, "action", None)
        # Any operation: a bad body/filter (400), no or a bad token (401), a role or scope short (403), an
        # object or a referenced id missing or foreign (404), a domain rule refusing the state (409).
        codes = [400, 401, 403, 404, 409]
        if self._tenant_view() and action in _OBJECT_WRITES:
            codes.append(412)
        if self.method in _WRITES:
            codes.append(422)  # a stale/reused Idempotency-Key, or a rule refusing the values
            codes.append(413)  # a body over the view's limit (apps.core.api.parsers)
            codes.append(429)  # a per-org rate (apps.core.quotas), with Retry-After
        if getattr(self.view, "throttle_scope", None):
            codes.append(429)
        codes += getattr(self.view, "error_statuses", ())  # a view's own preconditions (If-Match: 412, 428)
        return sorted(set(codes))

    def _get_serializer_field_meta(self, field, direction):
        meta = super()._get_serializer_field_meta(field, direction)
        # A read-only field over a nullable column answers null (DRF leaves allow_null False on those).
        if field.read_only and not meta.get("nullable") and _nullable_column(field):
            meta["nullable"] = True
        return meta


def _nullable_column(field) -> bool:
    model = getattr(getattr(field.parent, "Meta", None), "model", None)
    if model is None or not field.source or "." in field.source or field.source == "*":
        return False
    try:
        return bool(model._meta.get_field(field.source).null)
    except Exception:  # not a model field (a property, an annotation)
        return False
