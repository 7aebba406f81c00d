"""Who is asking, for the UI: `request.principal` from the session's user and chosen org (None if anonymous).

API requests with a Bearer token get their principal from the token in apps.accounts.authentication.
"""

from __future__ import annotations

from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from apps.accounts.services import principal_for_user
from apps.core.webserver import mark_tenant


class PrincipalMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        user = getattr(request, "user", None)
        principal = None
        if user is not None and user.is_authenticated:
            chosen = request.session.get("org")
            principal = principal_for_user(user, chosen)
            if principal is not None and chosen and principal.org.slug != chosen:
                # No longer a member of the org the session chose (removed): it lands in one the user has.
                request.session["org"] = principal.org.slug
            if principal is not None:
                mark_tenant(request.META, principal.org.pk)
        request.principal = principal  # type: ignore[attr-defined]
        return self.get_response(request)
