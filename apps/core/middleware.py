"""Request ids (one per request, echoed in X-Request-ID, logged and audited) and static files."""

from __future__ import annotations

import contextvars
import logging
import re
import uuid
from collections.abc import Callable
from typing import ClassVar

from django.core.signals import setting_changed
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from whitenoise.middleware import WhiteNoiseMiddleware

_request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="-")
_SAFE_ID = re.compile(r"^[A-Za-z0-9._-]{1,64}$")


def current_request_id() -> str:
    return _request_id.get()


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        incoming = request.headers.get("X-Request-ID", "")
        # A client-supplied id is kept only if it is harmless to log.
        rid = incoming if _SAFE_ID.match(incoming) else uuid.uuid4().hex
        token = _request_id.set(rid)
        request.request_id = rid  # type: ignore[attr-defined]
        try:
            response = self.get_response(request)
        finally:
            _request_id.reset(token)
        response["X-Request-ID"] = rid
        return response


class StaticFilesMiddleware(WhiteNoiseMiddleware):
    """WhiteNoise, listing the static finders' files once per process instead of once per middleware chain.

    Django builds a chain per handler: once in a server process, but once per client in the test suite, where
    finding and stat-ing every app's static files (224 here) cost ~7.5 ms of CPU each time, ~35 s a run. The
    files' entries hold paths and headers, not open files, so chains can share them. With autorefresh (DEBUG)
    WhiteNoise looks files up per request and never lists them.
    """

    _found: ClassVar[dict[str, dict]] = {}

    def add_files_from_finders(self) -> None:
        found = self._found.get(self.static_prefix)
        if found is None:
            own, self.files = self.files, {}
            super().add_files_from_finders()
            found, self.files = self.files, own
            self._found[self.static_prefix] = found
        self.files.update(found)


@receiver(setting_changed)
def _static_settings_changed(setting: str, **kwargs) -> None:
    """A test that changes where static files come from gets them found again."""
    if setting.startswith(("STATIC", "WHITENOISE_")) or setting == "INSTALLED_APPS":
        StaticFilesMiddleware._found.clear()


class RequestIdLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = _request_id.get()
        return True


class RefuseNulMiddleware:
    """A NUL character in the URL or query string is refused before any view runs.

    PostgreSQL cannot compare text with NUL, so `?slug=a%00b` reached a filter and answered 500;
    refusing it here keeps every present and future filter and lookup safe.
    """

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if "\x00" in request.path or any("\x00" in k or any("\x00" in v for v in vs)
                                         for k, vs in request.GET.lists()):
            from django.http import JsonResponse

            return JsonResponse({"code": "null_characters_not_allowed", "fields": {},
                                 "detail": "The URL must not contain NUL (%00) characters."}, status=400)
        return self.get_response(request)
