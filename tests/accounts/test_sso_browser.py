"""Single sign-on through a real OpenID provider (node-oidc-provider on loopback) in a real browser.

GIVEN an operator who configured Spillway's issuer, client and claim → org mapping (settings), WHEN people sign
in at the provider, THEN they land in the org and role their groups map to, are refused with a sentence when
their groups map to nothing, and a token from another issuer or for another client signs nobody in.
"""

from __future__ import annotations

import json
import time
from urllib.parse import parse_qs, urlparse

import pytest
import requests
from django.contrib.auth import get_user_model
from django.test import Client

from apps.accounts.models import Membership, Organization, Role, SsoIdentity
from tests.browser import login, shot
from tests.factories import MembershipFactory, OrganizationFactory, UserFactory
from tests.oidc import CLIENT_ID, CLIENT_SECRET, client, signing_jwks, start_op

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

ACCOUNTS = {
    "dana": {"email": "dana@acme.example", "email_verified": True, "preferred_username": "dana",
             "groups": ["acme-admins", "staff"]},
    "eve": {"email": "eve@contractor.example", "email_verified": True, "preferred_username": "eve",
            "groups": ["contractors"]},
}
ORG_MAP = [{"claim": "groups", "value": "acme-admins", "org": "acme", "role": "admin"},
           {"claim": "groups", "value": "staff", "org": "acme", "role": "viewer"},
           {"claim": "groups", "value": "globex-viewers", "org": "globex", "role": "viewer"}]


@pytest.fixture
def orgs(transactional_db):
    return (OrganizationFactory(slug="acme", kind=Organization.Kind.CUSTOMER),
            OrganizationFactory(slug="globex", kind=Organization.Kind.CUSTOMER))


@pytest.fixture
def op_factory(live_server, tmp_path):
    started = []

    def start(**kw):
        kw.setdefault("clients", [client(CLIENT_ID, f"{live_server.url}/oidc/callback/")])
        kw.setdefault("accounts", ACCOUNTS)
        op = start_op(tmp_path, **kw)
        started.append(op)
        return op

    yield start
    for op in started:
        op.stop()


@pytest.fixture
def sso(settings, op_factory, orgs):
    """Spillway configured for the OP, as an operator would (environment → these settings)."""
    op = op_factory()
    settings.SSO_ISSUER = op.issuer
    settings.SSO_CLIENT_ID = CLIENT_ID
    settings.SSO_CLIENT_SECRET = CLIENT_SECRET
    settings.SSO_ORG_MAP = json.dumps(ORG_MAP)
    return op


def sign_in_at_op(page, account: str) -> None:
    """From Spillway's login page: the SSO button, then the provider's own sign-in form."""
    page.goto("/login/")
    page.get_by_role("link", name="Sign in with single sign-on").click()
    page.locator("input[name=login]").fill(account)
    page.locator("input[name=password]").fill("any-password")
    page.get_by_role("button", name="Sign-in").click()


def test_sso_sign_in_lands_the_user_in_the_org_and_role_their_groups_map_to(page, sso):
    sign_in_at_op(page, "dana")
    page.wait_for_url("**/")
    header = page.locator("header .who").inner_text()
    assert "acme" in header and "dana · admin" in header  # acme-admins → admin beats staff → viewer
    shot(page, "sso-signed-in")
    user = get_user_model().objects.get(username="dana")
    assert not user.has_usable_password()  # made just in time; a password can never open it
    assert SsoIdentity.objects.get(user=user).subject == "dana"
    assert {(m.org.slug, m.role) for m in Membership.objects.filter(user=user)} == {("acme", Role.ADMIN)}
    # Admin rights are real: the members page offers the admin form to her.
    page.goto("/members/")
    assert page.get_by_role("button", name="Invite").is_visible()


def test_sso_roles_follow_the_idp_at_every_sign_in(page, sso, settings, orgs):
    sign_in_at_op(page, "dana")
    page.wait_for_url("**/")
    user = get_user_model().objects.get(username="dana")
    MembershipFactory(user=user, org=OrganizationFactory(slug="hand-added"), role=Role.EDITOR)
    # The operator remaps: acme-admins now gives editor, and dana's staff group gives globex viewer.
    settings.SSO_ORG_MAP = json.dumps([{**ORG_MAP[0], "role": "editor"},
                                       {"claim": "groups", "value": "staff", "org": "globex", "role": "viewer"}])
    page.get_by_role("button", name="Log out").click()
    page.goto("/login/")
    page.get_by_role("link", name="Sign in with single sign-on").click()  # still signed in at the IdP: no form
    page.wait_for_url("**/")
    roles = {(m.org.slug, m.role) for m in Membership.objects.filter(user=user)}
    assert roles == {("acme", Role.EDITOR), ("globex", Role.VIEWER), ("hand-added", Role.EDITOR)}
    assert get_user_model().objects.filter(username__startswith="dana").count() == 1  # same user, by `sub`


def test_an_account_whose_groups_map_to_no_org_is_refused_with_a_clear_message(page, sso):
    sign_in_at_op(page, "eve")
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "not in any group that Spillway maps to an organization" in alert.inner_text()
    shot(page, "sso-refused-no-org")
    assert not get_user_model().objects.filter(username="eve").exists()
    page.goto("/")
    page.wait_for_url("**/login/?next=/")


def test_local_login_off_offers_only_sso_and_refuses_the_password_form(page, sso, settings, orgs):
    alice = UserFactory(username="alice")
    alice.set_password("correct horse battery")
    alice.save()
    MembershipFactory(user=alice, org=orgs[0], role=Role.OWNER)
    before = Client()
    assert before.login(username="alice", password="correct horse battery")  # a password session, opened while on

    settings.LOCAL_LOGIN_ENABLED = False
    page.goto("/login/")
    assert page.get_by_role("link", name="Sign in with single sign-on").is_visible()
    assert page.locator("input[type=password]").count() == 0
    shot(page, "login-sso-only")
    # The form posted anyway (a script, an old tab): refused without checking the password.
    c = Client(enforce_csrf_checks=False)
    reply = c.post("/login/", {"username": "alice", "password": "correct horse battery"})
    assert reply.status_code == 403 and b"Password sign-in is turned off" in reply.content
    assert c.get("/").status_code == 302
    assert not Client().login(username="alice", password="correct horse battery")  # the admin's login too
    assert before.get("/").status_code == 302  # the session a password opened has ended
    sign_in_at_op(page, "dana")  # SSO still works
    page.wait_for_url("**/")
    assert "dana · admin" in page.locator("header .who").inner_text()


def test_a_token_from_another_issuer_signs_nobody_in(page, sso, settings, op_factory):
    """An OP with the same signing key and clients but another issuer (a look-alike, or endpoints pointed at
    the wrong provider): its id_tokens verify by signature, and are refused by issuer."""
    keys = signing_jwks()
    trusted = op_factory(jwks=keys)
    other = op_factory(jwks=keys)
    settings.SSO_ISSUER = trusted.issuer
    settings.SSO_AUTHORIZATION_ENDPOINT = f"{other.issuer}/auth"
    settings.SSO_TOKEN_ENDPOINT = f"{other.issuer}/token"
    settings.SSO_USERINFO_ENDPOINT = f"{other.issuer}/me"
    settings.SSO_JWKS_URI = f"{trusted.issuer}/jwks"
    sign_in_at_op(page, "dana")
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "another issuer" in alert.inner_text()
    assert not get_user_model().objects.filter(username="dana").exists()


def test_a_token_issued_for_another_client_is_refused(page, live_server, sso, settings, op_factory):
    """A real id_token the same OP minted for another application (its `aud`) is refused by Spillway's
    verification — the step the callback runs on every token it gets."""
    from apps.accounts.sso import SsoBackend, SsoRefused

    elsewhere = f"{live_server.url}/elsewhere/"
    op = op_factory(clients=[client(CLIENT_ID, f"{live_server.url}/oidc/callback/"),
                             client("other-app", elsewhere, secret="other-app-secret-0123456789")])
    settings.SSO_ISSUER = op.issuer
    page.goto(f"{op.issuer}/auth?client_id=other-app&response_type=code&scope=openid&nonce=n-1&state=s-1"
              f"&redirect_uri={elsewhere}")
    page.locator("input[name=login]").fill("dana")
    page.locator("input[name=password]").fill("any-password")
    page.get_by_role("button", name="Sign-in").click()
    page.wait_for_url("**/elsewhere/**")
    code = parse_qs(urlparse(page.url).query)["code"][0]
    tokens = requests.post(f"{op.issuer}/token", timeout=10, data={
        "grant_type": "authorization_code", "code": code, "redirect_uri": elsewhere,
        "client_id": "other-app", "client_secret": "other-app-secret-0123456789"}).json()
    backend = SsoBackend()
    with pytest.raises(SsoRefused, match="another application"):
        backend.verify_token(tokens["id_token"], nonce="n-1")


def test_the_session_ends_when_the_token_expires_and_the_idp_says_so(page, settings, op_factory, orgs):
    """Token expiry → a page load asks the IdP again without a prompt: renewed silently while the IdP session
    lives; once the user signed out at the IdP, Spillway's session ends too."""
    op = op_factory(ttl={"IdToken": 4})
    settings.SSO_ISSUER, settings.SSO_CLIENT_ID, settings.SSO_CLIENT_SECRET = op.issuer, CLIENT_ID, CLIENT_SECRET
    settings.SSO_ORG_MAP = json.dumps(ORG_MAP)
    sign_in_at_op(page, "dana")
    page.wait_for_url("**/")
    # Off the dashboard while the token expires: its htmx polls would meet the expiry first and renew it by
    # navigating back to "/", racing the page load below (a suite run once ended on "/" instead of /members/).
    page.goto("about:blank")
    time.sleep(5)
    page.goto("/members/")  # expired → silent renewal at the IdP → back on the page asked for
    page.wait_for_url("**/members/")
    assert page.get_by_role("heading", name="Members of acme").is_visible()

    page.goto(f"{op.issuer}/session/end")  # the user signs out at the IdP
    page.get_by_role("button", name="Yes, sign me out").click()
    page.wait_for_load_state()
    time.sleep(5)
    expired = page.request.get("/api/v1/memberships/")  # an expired session acts on nothing meanwhile
    assert expired.status == 401 and expired.json()["code"] == "sso_session_expired"
    page.goto("/members/")
    alert = page.get_by_role("alert")
    alert.wait_for()
    assert "single sign-on session has ended" in alert.inner_text()
    page.goto("/")
    page.wait_for_url("**/login/?next=/")


def test_password_login_still_works_beside_sso(page, sso, orgs):
    alice = UserFactory(username="alice")
    alice.set_password("correct horse battery")
    alice.save()
    MembershipFactory(user=alice, org=orgs[0], role=Role.OWNER)
    login(page, "alice", "correct horse battery")
    assert "alice · owner" in page.locator("header .who").inner_text()
