"""UI login with throttling: at most LOGIN_THROTTLE_ATTEMPTS password checks per username and per
address in a window; past that the login answers 429 with Retry-After and checks no password at all.

The attempt is counted *before* the password is checked, with an atomic increment, so parallel
attempts cannot all slip through a read-then-write gap (30 parallel attempts once got 12 checks for a
limit of 5). Redis's INCR is atomic; with the database cache the increment runs under a named
transaction lock (apps.core.locks) for the same guarantee.
"""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.db import transaction
from django.http import HttpResponse
from django.template.response import TemplateResponse

from apps.core.locks import xact_lock


def _keys(request) -> list[str]:
    ip = request.META.get("REMOTE_ADDR", "")
    user = request.POST.get("username", "").lower()[:150]
    digest = hashlib.sha256(user.encode()).hexdigest()[:16]
    return [f"login-attempt:ip:{ip}", f"login-attempt:user:{digest}"]


def _count_attempt(key: str) -> int:
    """Atomically add one attempt to `key` (created with the window as its lifetime); the new count."""
    window = settings.LOGIN_THROTTLE_WINDOW_S
    with transaction.atomic():
        xact_lock(key)  # a no-op cost with Redis; serialises the get/set of the database cache
        cache.add(key, 0, window)
        try:
            return cache.incr(key)
        except ValueError:  # expired between add and incr
            cache.set(key, 1, window)
            return 1


class ThrottledLoginView(auth_views.LoginView):
    template_name = "login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        keys = _keys(request)
        counts = [_count_attempt(k) for k in keys]
        if any(n > settings.LOGIN_THROTTLE_ATTEMPTS for n in counts):
            response: HttpResponse = TemplateResponse(
                request, "login.html",
                {"throttled": True, "form": self.get_form_class()(request)}, status=429)
            response["Retry-After"] = str(settings.LOGIN_THROTTLE_WINDOW_S)
            return response
        response = super().post(request, *args, **kwargs)
        if response.status_code == 302:
            cache.delete_many(keys)  # a success clears the slate for this user and address
        return response
