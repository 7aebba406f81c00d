"""OpenID Connect single sign-on: configuration, claim → org mapping, the authentication backends, session end.

mozilla-django-oidc runs the authorization-code flow (state, nonce, PKCE, token exchange, JWKS). What it leaves
to the site, done here:

- The id_token's issuer and audience are checked (the library verifies only the signature, expiry and nonce): a
  token minted by another issuer, or for another client of the same issuer, is refused.
- Users are made just in time and tied to the IdP's `sub` (SsoIdentity), never matched by email or username, so an
  IdP account cannot take over a local one.
- Claims → orgs and roles (SSO_ORG_MAP) at every sign-in; no matching org → refused with a sentence saying why.
- The session lives as long as the id_token (`exp`, capped at SSO_SESSION_MAX_S); past that the next page load
  goes back to the IdP with prompt=none, which either renews it silently or ends it (SsoSessionMiddleware).
- LOCAL_LOGIN_ENABLED=0 turns password sign-in off everywhere, and ends sessions that a password opened.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import jwt
import requests
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY
from django.contrib.auth.backends import ModelBackend
from django.core.exceptions import ImproperlyConfigured, PermissionDenied, SuspiciousOperation
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.urls import reverse
from django.utils.http import urlencode
from mozilla_django_oidc.auth import OIDCAuthenticationBackend
from mozilla_django_oidc.utils import import_from_settings

from apps.accounts.models import Role
from apps.core import outbound

log = logging.getLogger(__name__)

DISCOVERY_TTL_S = 300.0


def enabled() -> bool:
    return bool(settings.SSO_ISSUER)


# --- claim mapping (pure) -------------------------------------------------------------------------------


@dataclass(frozen=True)
class OrgRule:
    claim: str
    value: str
    org: str
    role: str


def parse_rules(raw: str | list[dict[str, Any]]) -> list[OrgRule]:
    """SSO_ORG_MAP, validated: a bad entry stops the process at start, not a user at sign-in."""
    try:
        items = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError as exc:
        raise ImproperlyConfigured(f"SSO_ORG_MAP is not JSON: {exc}") from None
    if not isinstance(items, list):
        raise ImproperlyConfigured("SSO_ORG_MAP must be a JSON list of {claim, value, org, role}")
    rules = []
    for item in items:
        if not isinstance(item, dict) or set(item) != {"claim", "value", "org", "role"} \
                or not all(isinstance(v, str) and v for v in item.values()):
            raise ImproperlyConfigured(f"SSO_ORG_MAP entry {item!r} needs exactly claim, value, org, role (strings)")
        if item["role"] not in Role.values:
            raise ImproperlyConfigured(f"SSO_ORG_MAP role {item['role']!r} is not one of {', '.join(Role.values)}")
        rules.append(OrgRule(**item))
    return rules


def rules() -> list[OrgRule]:
    return parse_rules(settings.SSO_ORG_MAP)


ROLE_ORDER = [Role.VIEWER, Role.EDITOR, Role.ADMIN, Role.OWNER]


def grants_for(claims: dict[str, Any], org_rules: list[OrgRule]) -> dict[str, str]:
    """{org slug: role} the claims earn; several matching rules for one org give the highest role."""
    grants: dict[str, str] = {}
    for rule in org_rules:
        have = claims.get(rule.claim)
        values = have if isinstance(have, list) else [have]
        if rule.value in [str(v) for v in values if v is not None]:
            old = grants.get(rule.org)
            if old is None or ROLE_ORDER.index(rule.role) > ROLE_ORDER.index(old):
                grants[rule.org] = rule.role
    return grants


# --- the provider's configuration (discovery) ---------------------------------------------------------------

_discovered: dict[str, tuple[float, dict[str, Any]]] = {}
_discovery_lock = threading.Lock()


class SsoUnavailable(Exception):
    pass


def discovery() -> dict[str, Any]:
    """The issuer's discovery document (cached a few minutes); its `issuer` must be the configured one."""
    issuer = settings.SSO_ISSUER
    with _discovery_lock:
        hit = _discovered.get(issuer)
        if hit and time.monotonic() - hit[0] < DISCOVERY_TTL_S:
            return hit[1]
    try:
        with outbound.deadline(float(settings.SSO_TIMEOUT_S), "the identity provider's discovery document"):
            reply = requests.get(f"{issuer}/.well-known/openid-configuration", timeout=settings.SSO_TIMEOUT_S)
            reply.raise_for_status()
            doc = reply.json()
    except (requests.RequestException, ValueError, OSError) as exc:
        raise SsoUnavailable(f"the identity provider {issuer} does not answer: {exc}") from None
    if str(doc.get("issuer", "")).rstrip("/") != issuer:
        raise SsoUnavailable(f"the discovery document of {issuer} names another issuer ({doc.get('issuer')!r})")
    with _discovery_lock:
        _discovered[issuer] = (time.monotonic(), doc)
    return doc


_FROM_SETTINGS = {"OIDC_RP_CLIENT_ID": "SSO_CLIENT_ID", "OIDC_RP_CLIENT_SECRET": "SSO_CLIENT_SECRET",
                  "OIDC_RP_SCOPES": "SSO_SCOPES", "OIDC_TIMEOUT": "SSO_TIMEOUT_S"}
# mozilla-django-oidc's name → (Spillway's setting, the discovery document's key).
_FROM_DISCOVERY = {"OIDC_OP_AUTHORIZATION_ENDPOINT": ("SSO_AUTHORIZATION_ENDPOINT", "authorization_endpoint"),
                   "OIDC_OP_TOKEN_ENDPOINT": ("SSO_TOKEN_ENDPOINT", "token_endpoint"),
                   "OIDC_OP_USER_ENDPOINT": ("SSO_USERINFO_ENDPOINT", "userinfo_endpoint"),
                   "OIDC_OP_JWKS_ENDPOINT": ("SSO_JWKS_URI", "jwks_uri")}
_FIXED = {"OIDC_RP_SIGN_ALGO": "RS256", "OIDC_USE_PKCE": True, "OIDC_USE_NONCE": True, "OIDC_CREATE_USER": True,
          "OIDC_AUTHENTICATION_CALLBACK_URL": "sso-callback", "LOGIN_REDIRECT_URL_FAILURE": "/login/"}


def oidc_setting(attr: str, *default: Any) -> Any:
    """What mozilla-django-oidc asks for, from Spillway's SSO_* settings and the discovery document."""
    if attr in _FROM_SETTINGS:
        return getattr(settings, _FROM_SETTINGS[attr])
    if attr in _FROM_DISCOVERY:
        name, key = _FROM_DISCOVERY[attr]
        if not enabled() or getattr(settings, name, ""):
            return getattr(settings, name, "")
        try:
            return discovery()[key]
        except (SsoUnavailable, KeyError) as exc:
            log.warning("SSO: %s", exc)
            return ""
    if attr in _FIXED:
        return _FIXED[attr]
    return import_from_settings(attr, *default)


# --- backends -------------------------------------------------------------------------------------------


class LocalBackend(ModelBackend):
    """Username and password; with LOCAL_LOGIN_ENABLED off it checks nothing and its sessions end."""

    def authenticate(self, request, username=None, password=None, **kwargs):
        if not settings.LOCAL_LOGIN_ENABLED:
            return None
        return super().authenticate(request, username=username, password=password, **kwargs)

    def get_user(self, user_id):
        return super().get_user(user_id) if settings.LOCAL_LOGIN_ENABLED else None


class SsoRefused(SuspiciousOperation):
    """The IdP's answer cannot sign anyone in; `message` is shown on the login page."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class SsoBackend(OIDCAuthenticationBackend):
    get_settings = staticmethod(oidc_setting)

    def authenticate(self, request, **kwargs):
        if not enabled() or request is None or "code" not in request.GET:
            return None
        # The token, key and user-information requests share one deadline (apps.core.outbound): an IdP that
        # trickles its answers fails the sign-in in seconds instead of holding a web thread.
        try:
            with outbound.deadline(2 * float(settings.SSO_TIMEOUT_S), "signing in at the identity provider"):
                return super().authenticate(request, **kwargs)
        except (outbound.DeadlineExceeded, requests.RequestException) as exc:
            log.warning("SSO: the identity provider did not answer: %s", exc)
            raise SsoRefused("The identity provider did not answer in time; nobody was signed in. Try again in "
                             "a minute.") from None

    def get_payload_data(self, token, key):
        """Signature, expiry, and — unlike the library's default — issuer and audience (and azp)."""
        client_id = self.OIDC_RP_CLIENT_ID
        try:
            payload = jwt.decode(token, key, algorithms=[self.OIDC_RP_SIGN_ALGO], audience=client_id,
                                 issuer=settings.SSO_ISSUER, leeway=30,
                                 options={"require": ["exp", "iat", "iss", "aud", "sub"]})
        except jwt.InvalidAudienceError:
            raise SsoRefused("The identity provider's token was issued for another application (audience), "
                             "not for Spillway; nobody was signed in.") from None
        except jwt.InvalidIssuerError:
            raise SsoRefused("The identity provider's token comes from another issuer than the one Spillway "
                             "trusts; nobody was signed in.") from None
        except jwt.PyJWTError as exc:
            raise SsoRefused(f"The identity provider's token is not valid ({exc}); nobody was signed in.") from None
        aud = payload["aud"]
        if isinstance(aud, list) and len(aud) > 1 and payload.get("azp") != client_id:
            raise SsoRefused("The identity provider's token was issued for another application (azp); "
                             "nobody was signed in.")
        return payload

    def get_or_create_user(self, access_token, id_token, payload):
        from apps.accounts.services import SsoNoOrg, sso_user_sync

        info = self.get_userinfo(access_token, id_token, payload)
        if info.get("sub") != payload["sub"]:  # OIDC Core 5.3.2: userinfo must be about the token's subject
            raise SsoRefused("The identity provider's user information is about another account.")
        claims = {**payload, **info}
        name = claims.get(settings.SSO_USERNAME_CLAIM) or claims.get("email") or payload["sub"]
        try:
            user = sso_user_sync(issuer=settings.SSO_ISSUER, subject=payload["sub"], username=str(name),
                                 email=str(claims.get("email") or ""), grants=grants_for(claims, rules()),
                                 managed_orgs={r.org for r in rules()})
        except SsoNoOrg as exc:
            self.request.sso_error = exc.message
            raise PermissionDenied(exc.message) from None
        self.request.session["sso_expires_at"] = min(float(payload["exp"]),
                                                     time.time() + settings.SSO_SESSION_MAX_S)
        return user

    def get_user(self, user_id):
        user = super().get_user(user_id)
        return user if user is not None and user.is_active and enabled() else None


# --- session end ------------------------------------------------------------------------------------------

SSO_BACKEND = f"{SsoBackend.__module__}.{SsoBackend.__qualname__}"


class SsoSessionMiddleware:
    """A session opened by SSO acts until its id_token expires. Past that, every request is refused until the IdP
    renews it: a page load is sent to the IdP without a prompt (prompt=none) — still signed in there → back on
    the page with a new token; signed out there → logged out, and the login page says the SSO session ended.
    An htmx request gets the same round trip as a full navigation (HX-Redirect); anything else gets 401.
    The session is not ended here, so the dashboard's background polls cannot log out someone the IdP would
    have renewed. Runs after AuthenticationMiddleware."""

    EXEMPT = ("/oidc/", "/login/", "/logout/")

    def __init__(self, get_response) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        expires_at = request.session.get("sso_expires_at")
        if expires_at is None or request.session.get(BACKEND_SESSION_KEY) != SSO_BACKEND \
                or time.time() < float(expires_at) or request.path.startswith(self.EXEMPT):
            return self.get_response(request)
        if request.headers.get("HX-Request"):
            current = urlsplit(request.headers.get("HX-Current-URL", ""))
            return HttpResponse(status=204, headers={"HX-Redirect": self.renewal(current.path or "/", current.query)})
        if request.method == "GET" and not request.path.startswith("/api/"):
            return HttpResponseRedirect(self.renewal(request.path, request.META.get("QUERY_STRING", "")))
        return JsonResponse({"code": "sso_session_expired",
                             "detail": "Your single sign-on session expired; load a page to renew it."}, status=401)

    @staticmethod
    def renewal(path: str, query: str) -> str:
        target = f"{path}?{query}" if query else path
        return f"{reverse('sso-login')}?{urlencode({'prompt': 'none', 'next': target})}"
