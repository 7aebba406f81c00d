"""Project-level views: liveness and Prometheus metrics (they read every app, so they sit above them)."""

from __future__ import annotations

import logging
import sys

from django.conf import settings
from django.db import connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template import loader
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from apps.accounts.models import Scope
from apps.accounts.services import principal_for_token, token_authenticate
from apps.core import metrics as _metrics  # noqa: F401  (registers collectors)
from apps.core import netpolicy
from apps.core.api.errors import UNAVAILABLE_RETRY_AFTER_S, is_unavailable, server_error_body, unavailable_body
from frontend import views as frontend_views


def healthz(request: HttpRequest) -> JsonResponse:
    with connection.cursor() as cur:
        cur.execute("SELECT 1")
    return JsonResponse({"status": "ok"})


def _metrics_allowed(request: HttpRequest) -> bool:
    """Metrics name every fleet, node and pool: a scraper on an allowed network, or an operator token."""
    peer = netpolicy.parse_ip(request.META.get("REMOTE_ADDR", ""))
    nets = netpolicy.parse_networks(settings.METRICS_ALLOWED_NETWORKS)
    if peer is not None and any(peer.version == n.version and peer in n for n in nets):
        return True
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer "):
        return False
    token = token_authenticate(header.removeprefix("Bearer ").strip())
    principal = principal_for_token(token) if token is not None else None  # its owner still a member
    return principal is not None and principal.is_operator and Scope.READ in principal.scopes


def metrics(request: HttpRequest) -> HttpResponse:
    if not _metrics_allowed(request):
        response = JsonResponse({"code": "not_authenticated", "fields": {},
                                 "detail": "Metrics need an operator token with the read scope, or a scraper on "
                                           "a network listed in METRICS_ALLOWED_NETWORKS."}, status=401)
        response["WWW-Authenticate"] = "Bearer"
        return response
    return HttpResponse(generate_latest(), content_type=CONTENT_TYPE_LATEST)


# --- error pages: JSON under /api/ (the documented {"code","detail","fields"} shape), HTML elsewhere ---


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith("/api/")


def error_404(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"code": "not_found", "detail": "Not found.", "fields": {}}, status=404)
    return frontend_views.error_404(request, exception)


def error_500(request: HttpRequest) -> HttpResponse:
    """Django's last resort (an exception outside a DRF view, e.g. in a middleware). Called inside Django's
    `except` for the exception: a database or Redis out of reach is a 503 with Retry-After, not a 500."""
    exc = sys.exc_info()[1]
    if is_unavailable(exc):
        return _unavailable(request, exc)
    if _is_api(request):
        return JsonResponse(server_error_body(), status=500)
    return frontend_views.error_500(request)


def _unavailable(request: HttpRequest, exc: BaseException) -> HttpResponse:
    logging.getLogger("spillway.api").warning("%s %s: %s", request.method, request.path, exc)
    if _is_api(request):
        response: HttpResponse = JsonResponse(unavailable_body(exc), status=503)
    else:
        # Rendered without the request's context: its processors read the session and the principal (the
        # database this page is about).
        body = loader.render_to_string("503.html", {"retry_after_s": UNAVAILABLE_RETRY_AFTER_S,
                                                    "detail": unavailable_body(exc)["detail"]})
        response = HttpResponse(body, status=503)
    response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER_S)
    return response
