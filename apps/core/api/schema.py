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


# --- descriptions a reader of the schema can use ---------------------------------------------------------------

_VERBS = {"list": "List", "retrieve": "Read one", "create": "Create", "update": "Replace",
          "partial_update": "Change fields of", "destroy": "Delete"}


def _repeated(texts: list[str], at_least: int = 3) -> set[str]:
    """Descriptions shared by several schemas or operations: a base class's or mixin's docstring (a note for
    developers about tenancy or a test file) that drf-spectacular printed on every subclass."""
    from collections import Counter

    return {text for text, count in Counter(t.strip() for t in texts if t).items() if count >= at_least}


def _words(name: str) -> str:
    import re

    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()


def describe_hook(result, generator, request, public):
    """POSTPROCESSING_HOOKS: every component and operation says what it is for an integrator, never a
    developer note inherited from a base class, and none is left without a description."""
    components = result.get("components", {}).get("schemas", {})
    operations = [op for ops in result.get("paths", {}).values() for op in ops.values() if isinstance(op, dict)]
    internal = _repeated([c.get("description", "") for c in components.values()]) | _repeated(
        [op.get("description", "") for op in operations])

    def internal_or_empty(text: str | None) -> bool:
        text = (text or "").strip()
        return not text or text in internal or "tests/" in text or "apps." in text

    for name, component in components.items():
        if internal_or_empty(component.get("description")):
            base = name.removesuffix("Request").removeprefix("Patched")
            kind = "what you send to create or change" if name.endswith("Request") else "as the API answers it"
            component["description"] = f"A {_words(base)}, {kind}."
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if not isinstance(operation, dict) or "operationId" not in operation:
                continue
            if internal_or_empty(operation.get("description")):
                operation["description"] = _generated(method, path, operation)
    return result


def _generated(method: str, path: str, operation: dict) -> str:
    parts = [p for p in path.strip("/").split("/") if p and not p.startswith("{") and p not in ("api", "v1")]
    resource = parts[0].replace("-", " ") if parts else "objects"
    op = operation["operationId"]
    action = next((a for a in _VERBS if op.endswith("_" + a)), None)
    scope = "you can see (your organization's; an operator sees every organization's)"
    if len(parts) > 1 and action is None:  # a custom action: /things/{id}/verb/
        verb = parts[-1].replace("-", " ")
        return f"{verb.capitalize()} one of the {resource} {scope}."
    if action == "list":
        return f"List the {resource} {scope}, paginated; the query parameters filter and order them."
    if action is not None:
        return f"{_VERBS[action]} one of the {resource} {scope}." if action != "create" else \
            f"Create one of the {resource}, in your organization unless an operator names another."
    return f"{method.upper()} {resource}."
