"""Every API error is JSON: {"code": ..., "detail": ..., "fields": {...}}."""

from __future__ import annotations

import logging
import re
from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig
from django.db import DataError, IntegrityError, InterfaceError, OperationalError
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler
from rest_framework.views import set_rollback

from apps.core.errors import REDIS_ERRORS, DomainError

logger = logging.getLogger("spillway.api")

_CODES = {
    status.HTTP_400_BAD_REQUEST: "invalid",
    status.HTTP_401_UNAUTHORIZED: "not_authenticated",
    status.HTTP_403_FORBIDDEN: "permission_denied",
    status.HTTP_404_NOT_FOUND: "not_found",
    status.HTTP_405_METHOD_NOT_ALLOWED: "method_not_allowed",
    status.HTTP_406_NOT_ACCEPTABLE: "not_acceptable",
    status.HTTP_412_PRECONDITION_FAILED: "stale_revision",
    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE: "unsupported_media_type",
    status.HTTP_429_TOO_MANY_REQUESTS: "throttled",
}


class PreconditionFailed(exceptions.APIException):
    status_code = status.HTTP_412_PRECONDITION_FAILED
    default_detail = "The object changed since you read it; fetch it again and retry with the new ETag."
    default_code = "stale_revision"


class ApiError(exceptions.APIException):
    """An error with an explicit code and status, raised by the API layer itself."""

    def __init__(self, code: str, detail: str, status_code: int = 400, fields: dict | None = None) -> None:
        super().__init__(detail)
        self.code = code
        self.status_code = status_code
        self.fields = fields or {}


def _flatten(detail: Any) -> Any:
    if isinstance(detail, dict):
        return {k: _flatten(v) for k, v in detail.items()}
    if isinstance(detail, list):
        return [_flatten(v) for v in detail]
    return str(detail)


def exception_handler(exc, context):
    if is_unavailable(exc):
        logger.warning("%s %s: %s unreachable (%s)", getattr(context.get("request"), "method", "?"),
                       getattr(context.get("request"), "path", "?"), unavailable_part(exc), exc)
        set_rollback()
        return Response(unavailable_body(exc), status=status.HTTP_503_SERVICE_UNAVAILABLE,
                        headers={"Retry-After": str(UNAVAILABLE_RETRY_AFTER_S)})
    if isinstance(exc, DomainError):
        fields = {exc.field: [exc.detail]} if exc.field else {}
        headers = {"Retry-After": str(exc.retry_after_s)} if exc.retry_after_s else None
        return Response({"code": exc.code, "detail": exc.detail, "fields": fields}, status=exc.status,
                        headers=headers)
    if isinstance(exc, ApiError):
        return Response({"code": exc.code, "detail": str(exc.detail), "fields": exc.fields},
                        status=exc.status_code)
    if isinstance(exc, IntegrityError | DataError):
        return _database_refused(exc)
    if isinstance(exc, RequestDataTooBig):  # over DATA_UPLOAD_MAX_MEMORY_SIZE, the ceiling above every view's own
        return Response({"code": "request_too_large", "detail": "The request body is too large.", "fields": {}},
                        status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return _server_error(exc, context)
    code = "parse_error" if isinstance(exc, exceptions.ParseError) else _CODES.get(response.status_code, "error")
    if isinstance(exc, exceptions.ValidationError):
        fields = _flatten(exc.detail) if isinstance(exc.detail, dict) else {"non_field_errors": _flatten(exc.detail)}
        codes = exc.get_codes()
        # Surface the first specific validator code (e.g. invalid_hostname) as the error code.
        specific = _first_code(codes)
        body = {"code": specific or "invalid", "detail": "Some fields are invalid.", "fields": fields}
    else:
        detail = exc.detail if isinstance(exc, exceptions.APIException) else str(exc)
        body = {"code": code, "detail": str(detail), "fields": {}}
    response.data = body
    return response


def _first_code(codes: Any) -> str | None:
    if isinstance(codes, dict):
        for value in codes.values():
            found = _first_code(value)
            if found:
                return found
    elif isinstance(codes, list):
        for value in codes:
            found = _first_code(value)
            if found:
                return found
    elif isinstance(codes, str) and codes not in ("invalid", "required", "null", "blank"):
        return codes
    return None


def server_error_body() -> dict[str, Any]:
    return {"code": "server_error", "detail": "The server failed to answer this request; it has been logged.",
            "fields": {}}


# While the database or Redis is down (restarted, failed over, unreachable) a request is answered 503 with this
# Retry-After, not 500: nothing is wrong with the request, and a client that retries succeeds once it is back.
UNAVAILABLE_RETRY_AFTER_S = 5


_UNAVAILABLE = (OperationalError, InterfaceError, *REDIS_ERRORS)


def is_unavailable(exc: BaseException | None) -> bool:
    """The request failed because a service Spillway depends on could not be reached (or dropped the
    connection), not because of the request or a bug."""
    return isinstance(exc, _UNAVAILABLE)


def unavailable_part(exc: BaseException) -> str:
    return "the database" if isinstance(exc, OperationalError | InterfaceError) else "Redis"


def unavailable_body(exc: BaseException) -> dict[str, Any]:
    return {"code": "unavailable", "fields": {},
            "detail": f"Spillway cannot reach {unavailable_part(exc)} right now; a write in this request was not "
                      f"saved. Retry after {UNAVAILABLE_RETRY_AFTER_S} seconds. Load balancers keep serving their "
                      "last config meanwhile."}


def _server_error(exc: Exception, context) -> Response:
    """A bug: logged with its traceback, answered in the documented shape (DEBUG or not), no internals."""
    request = context.get("request")
    logger.error("unhandled %s in %s %s", type(exc).__name__, getattr(request, "method", "?"),
                 getattr(request, "path", "?"), exc_info=exc)
    set_rollback()
    return Response(server_error_body(), status=status.HTTP_500_INTERNAL_SERVER_ERROR)


# PostgreSQL SQLSTATEs of constraints a concurrent or duplicate write can trip.
_UNIQUE_VIOLATION, _FOREIGN_KEY_VIOLATION = "23505", "23503"


def _database_refused(exc: IntegrityError | DataError) -> Response:
    """The one place a constraint the database enforced becomes an API error (no service repeats it).

    A duplicate (org slug, fleet name, ...) is a 409 `conflict` naming the fields of the violated
    unique constraint, never the row that holds the value (it may be another tenant's). A value the
    database cannot store (an out-of-range number or time zone) is a 400.
    """
    set_rollback()
    cause = exc.__cause__
    sqlstate = getattr(cause, "sqlstate", None)
    diag = getattr(cause, "diag", None)
    if isinstance(exc, DataError):
        return Response({"code": "invalid", "detail": "A value is out of the range the server can store.",
                         "fields": {}}, status=status.HTTP_400_BAD_REQUEST)
    if sqlstate == _UNIQUE_VIOLATION:
        names = _constraint_fields(getattr(diag, "table_name", None), getattr(diag, "message_detail", None))
        fields = {name: ["An object with this value already exists."] for name in names}
        return Response({"code": "conflict", "detail": "An object with these values already exists.",
                         "fields": fields}, status=status.HTTP_409_CONFLICT)
    if sqlstate == _FOREIGN_KEY_VIOLATION:
        detail = "A referenced object was deleted or is still referenced; reload and retry."
    else:
        detail = "The change conflicts with the current state; reload and retry."
    return Response({"code": "conflict", "detail": detail, "fields": {}}, status=status.HTTP_409_CONFLICT)


def _constraint_fields(table: str | None, message_detail: str | None) -> list[str]:
    """API field names of the violated unique constraint, from PostgreSQL's "Key (a, b)=(...)" detail
    (the values are never echoed), minus the org every tenant row carries."""
    from django.apps import apps

    match = _KEY_RE.match(message_detail or "")
    if not table or not match:
        return []
    columns = set(re.findall(r"[a-z_][a-z0-9_]*", match.group(1)))
    for model in apps.get_models():
        if model._meta.db_table == table:
            names = [f.name for f in model._meta.concrete_fields if f.column in columns]
            return [n for n in names if n != "org"] or names
    return []


_KEY_RE = re.compile(r"^Key \((.*?)\)=\(")
