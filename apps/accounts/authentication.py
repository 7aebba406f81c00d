"""API authentication: `Authorization: Bearer <token>`, or the UI's session."""

from __future__ import annotations

from rest_framework import authentication, exceptions

from apps.accounts.services import principal_for_token, principal_for_user, token_authenticate
from apps.core.webserver import mark_tenant


class BearerTokenAuthentication(authentication.BaseAuthentication):
    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).decode("latin-1")
        if not header:
            return None
        parts = header.split()
        if parts[0] != self.keyword:
            return None
        if len(parts) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header; use 'Bearer <token>'.")
        token = token_authenticate(parts[1])
        principal = principal_for_token(token) if token is not None else None
        if principal is None:  # unknown, expired, revoked, or its owner left the org: one answer for all
            raise exceptions.AuthenticationFailed("Invalid, expired or revoked token.")
        request.principal = principal
        mark_tenant(request.META, principal.org.pk)
        return (token.user, token)

    def authenticate_header(self, request) -> str:
        return self.keyword


class SessionAuthentication401(authentication.SessionAuthentication):
    """Session auth for the browser; anonymous API calls get 401 (not 403)."""

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            return None
        principal = principal_for_user(result[0], request._request.session.get("org"))
        if principal is None:
            raise exceptions.PermissionDenied("Your account belongs to no organization.")
        request.principal = principal
        return result

    def authenticate_header(self, request) -> str:
        return "Bearer"
