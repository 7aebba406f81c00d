"""UI login with throttling: at most LOGIN_THROTTLE_ATTEMPTS password checks per username and per
address in a window; past that the login answers 429 with Retry-After and checks no password at all.

The attempt is counted *before* the password is checked, with an atomic increment, so parallel
attempts cannot all slip through a read-then-write gap (30 parallel attempts once got 12 checks for a
limit of 5). Redis's INCR is atomic; with the database cache the increment runs under a named
transaction lock (apps.core.locks) for the same guarantee.
"""

from __future__ import annotations

import contextlib
import hashlib
import ipaddress

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.contrib.auth.base_user import AbstractBaseUser
from django.core.cache import cache
from django.db import transaction
from django.http import HttpResponse
from django.template.response import TemplateResponse

from apps.accounts.sso_views import login_context, login_page
from apps.core import netpolicy
from apps.core.locks import xact_lock


def _ip_key(request) -> str:
    ip = netpolicy.parse_ip(request.META.get("REMOTE_ADDR", ""))
    if ip is not None and ip.version == 6:
        # One IPv6 client usually holds a whole /64: count the network, not each address in it.
        return "login-attempt:ip:" + str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return f"login-attempt:ip:{ip}"


def _user_key(request) -> str:
    # The name as authentication sees it: the form strips whitespace (NBSP too) and the user model
    # NFKC-normalises, so " charlie", "charlie\t" and a fullwidth-c "charlie" are one account, one counter.
    name = AbstractBaseUser.normalize_username(request.POST.get("username", "").strip()).casefold()[:150]
    return "login-attempt:user:" + hashlib.sha256(name.encode()).hexdigest()[:16]


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
    """Password sign-in (when LOCAL_LOGIN_ENABLED) beside the single sign-on button (when SSO_ISSUER is set)."""

    template_name = "login.html"
    redirect_authenticated_user = True

    def get_context_data(self, **kwargs):
        return {**super().get_context_data(**kwargs), **login_context()}

    def post(self, request, *args, **kwargs):
        if not settings.LOCAL_LOGIN_ENABLED:
            # No password is checked (nor counted) at all: the form is refused before authentication.
            return login_page(request, "Password sign-in is turned off here; use single sign-on.", 403)
        ip_key, user_key = _ip_key(request), _user_key(request)
        counts = [_count_attempt(k) for k in (ip_key, user_key)]
        if any(n > settings.LOGIN_THROTTLE_ATTEMPTS for n in counts):
            response: HttpResponse = TemplateResponse(
                request, "login.html",
                {"throttled": True, "form": self.get_form_class()(request), **login_context()}, status=429)
            response["Retry-After"] = str(settings.LOGIN_THROTTLE_WINDOW_S)
            return response
        response = super().post(request, *args, **kwargs)
        if response.status_code == 302:
            # A success clears that user's counter and gives back its own attempt on the address's: the
            # address counts failures only, so people behind one address can all log in, while an attacker
            # logging into an account of its own between guesses resets nothing.
            cache.delete(user_key)
            with contextlib.suppress(ValueError):
                cache.decr(ip_key)
        return response
