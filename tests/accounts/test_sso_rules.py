"""SSO claim → org mapping (pure) and the SSO endpoints when SSO is not configured."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from apps.accounts.sso import OrgRule, grants_for, parse_rules

RULES = [OrgRule("groups", "acme-admins", "acme", "admin"), OrgRule("groups", "staff", "acme", "viewer"),
         OrgRule("department", "ops", "ops", "editor")]


def test_the_highest_role_of_every_matching_rule_wins_per_org():
    claims = {"groups": ["staff", "acme-admins"], "department": "ops"}
    assert grants_for(claims, RULES) == {"acme": "admin", "ops": "editor"}


def test_claims_matching_no_rule_grant_nothing():
    assert grants_for({"groups": ["contractors"], "department": "sales"}, RULES) == {}
    assert grants_for({}, RULES) == {}
    assert grants_for({"groups": "acme-admins-not"}, RULES) == {}


@pytest.mark.parametrize("raw", ["not json", "{}", '[{"claim": "groups", "value": "x", "org": "acme"}]',
                                 '[{"claim": "groups", "value": "x", "org": "acme", "role": "god"}]',
                                 '[{"claim": "groups", "value": "", "org": "acme", "role": "admin"}]'])
def test_a_bad_mapping_is_refused_at_start(raw):
    with pytest.raises(ImproperlyConfigured):
        parse_rules(raw)


def test_sso_endpoints_are_absent_and_the_login_page_has_no_sso_button_when_not_configured(client, settings):
    settings.SSO_ISSUER = ""
    assert client.get("/oidc/authenticate/").status_code == 404
    assert client.get("/oidc/callback/?code=x&state=y").status_code == 404
    page = client.get("/login/").content.decode()
    assert "single sign-on" not in page and 'type="password"' in page


@pytest.mark.django_db
@pytest.mark.parametrize("error", ["login_required", "access_denied", "interaction_required"])
def test_an_idp_error_link_does_not_sign_out_a_session_it_did_not_start(client, settings, alice, error):
    """GET /oidc/callback/?error=login_required signed out anyone who followed a planted link (logout CSRF)."""
    settings.SSO_ISSUER = "https://idp.example"
    client.force_login(alice.user)
    assert client.get("/members/").status_code == 200
    response = client.get(f"/oidc/callback/?error={error}&state=planted")
    assert response.status_code == 302 and response["Location"] == "/"
    assert client.get("/members/").status_code == 200  # still signed in
