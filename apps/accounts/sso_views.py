"""The two SSO endpoints: start the sign-in at the IdP, and take its answer (mozilla-django-oidc's views).

Every refusal lands on the login page with a sentence saying why (403), never a bare 400 or a redirect loop.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import SuspiciousOperation
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from mozilla_django_oidc.views import OIDCAuthenticationCallbackView, OIDCAuthenticationRequestView

from apps.accounts import sso

SESSION_ENDED = "Your single sign-on session has ended; sign in again."
GENERIC = "Single sign-on did not complete; nobody was signed in. Try again."


def login_page(request, message: str, status: int) -> TemplateResponse:
    if not request.user.is_authenticated:
        request.principal = None  # computed before this request logged the user out (the IdP's error answer)
    return TemplateResponse(request, "login.html", login_context(sso_error=message), status=status)


def login_context(**extra) -> dict:
    return {"sso_enabled": sso.enabled(), "sso_label": settings.SSO_BUTTON_LABEL,
            "local_login": settings.LOCAL_LOGIN_ENABLED, **extra}


class SsoLoginView(OIDCAuthenticationRequestView):
    """GET /oidc/authenticate/[?next=…][&prompt=none] → the IdP's authorization endpoint."""

    get_settings = staticmethod(sso.oidc_setting)

    def get(self, request):
        if not sso.enabled():
            raise Http404("Single sign-on is not configured.")
        if not self.OIDC_OP_AUTH_ENDPOINT:
            return login_page(request, "The identity provider does not answer; try again in a minute.", 503)
        return super().get(request)

    def get_extra_params(self, request) -> dict[str, str]:
        # prompt=none: the silent renewal SsoSessionMiddleware starts when a session's token expired.
        return {"prompt": "none"} if request.GET.get("prompt") == "none" else {}


class SsoCallbackView(OIDCAuthenticationCallbackView):
    """GET /oidc/callback/?code=…&state=… (or ?error=…) from the IdP."""

    get_settings = staticmethod(sso.oidc_setting)

    def get(self, request):
        if not sso.enabled():
            raise Http404("Single sign-on is not configured.")
        if "error" in request.GET and request.GET.get("state") not in (request.session.get("oidc_states") or {}):
            # An error answer to no sign-in this session started: a link anyone can plant (logout CSRF). The
            # library would sign the session out; a session it did not start is left alone.
            if request.user.is_authenticated:
                return HttpResponseRedirect("/")
            return login_page(request, GENERIC, 403)
        try:
            return super().get(request)
        except sso.SsoRefused as exc:
            return login_page(request, exc.message, 403)
        except SuspiciousOperation:  # unknown state: an old tab, a replay, or a sign-in started elsewhere
            return login_page(request, GENERIC, 403)

    def login_failure(self):
        request = self.request
        message = getattr(request, "sso_error", None)
        if message is None and request.GET.get("error") in {"login_required", "interaction_required",
                                                           "consent_required"}:
            message = SESSION_ENDED
        elif message is None and getattr(self, "user", None) is not None and not self.user.is_active:
            message = "Your Spillway account is disabled; ask your operator."
        return login_page(request, message or GENERIC, 403)
