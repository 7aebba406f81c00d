"""UI login with throttling: repeated failures for a username or an address answer 429 for a while."""

from __future__ import annotations

import hashlib

from django.conf import settings
from django.contrib.auth import views as auth_views
from django.core.cache import cache
from django.http import HttpResponse
from django.template.response import TemplateResponse


def _keys(request) -> list[str]:
    ip = request.META.get("REMOTE_ADDR", "")
    user = request.POST.get("username", "").lower()[:150]
    digest = hashlib.sha256(user.encode()).hexdigest()[:16]
    return [f"login-fail:ip:{ip}", f"login-fail:user:{digest}"]


class ThrottledLoginView(auth_views.LoginView):
    template_name = "login.html"
    redirect_authenticated_user = True

    def post(self, request, *args, **kwargs):
        keys = _keys(request)
        if any((cache.get(k) or 0) >= settings.LOGIN_THROTTLE_ATTEMPTS for k in keys):
            response: HttpResponse = TemplateResponse(
                request, "login.html",
                {"throttled": True, "form": self.get_form_class()(request)}, status=429)
            response["Retry-After"] = str(settings.LOGIN_THROTTLE_WINDOW_S)
            return response
        response = super().post(request, *args, **kwargs)
        if response.status_code != 302:
            for k in keys:
                cache.add(k, 0, settings.LOGIN_THROTTLE_WINDOW_S)
                try:
                    cache.incr(k)
                except ValueError:
                    cache.set(k, 1, settings.LOGIN_THROTTLE_WINDOW_S)
        else:
            cache.delete_many(keys)
        return response
