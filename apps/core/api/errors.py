"""Every API error is JSON: {"code": ..., "detail": ..., "fields": {...}}."""

from __future__ import annotations

from typing import Any

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from apps.core.errors import DomainError

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
    if isinstance(exc, DomainError):
        fields = {exc.field: [exc.detail]} if exc.field else {}
        return Response({"code": exc.code, "detail": exc.detail, "fields": fields}, status=exc.status)
    if isinstance(exc, ApiError):
        return Response({"code": exc.code, "detail": str(exc.detail), "fields": exc.fields},
                        status=exc.status_code)
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    code = _CODES.get(response.status_code, "error")
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
