"""Who is asking, for the UI: `request.principal` from the session's user and chosen org (None if anonymous).

API requests with a Bearer token get their principal from the token in apps.accounts.authentication.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from apps.accounts.services import principal_for_user


class PrincipalMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        request.principal = (  # type: ignore[attr-defined]
            principal_for_user(user, request.session.get("org")) if user is not None and user.is_authenticated
            else None)
        return self.get_response(request)
