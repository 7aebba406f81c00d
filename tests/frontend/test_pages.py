"""Tokens and audit pages (server-rendered; the browser journeys are in test_browser.py)."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.accounts.models import ApiToken
from apps.audit.models import AuditEvent


@pytest.fixture
def web(alice) -> Client:
    client = Client()
    client.force_login(alice.user)
    return client


@pytest.mark.django_db
def test_token_secret_is_shown_once_then_only_its_prefix(web, alice):
    response = web.post("/tokens/", {"name": "deploy", "scopes": ["read", "deploy"]})
    token = ApiToken.objects.get(name="deploy")
    body = response.content.decode()
    assert "shown <strong>once</strong>" in body and f"spw_{token.prefix}_" in body
    again = web.get("/tokens/").content.decode()
    assert token.prefix in again and f"spw_{token.prefix}_" not in again
    web.post(f"/tokens/{token.pk}/revoke/")
    token.refresh_from_db()
    assert token.revoked_at is not None


@pytest.mark.django_db
def test_viewer_cannot_create_tokens_and_outsider_cannot_revoke(alice, vera, charlie):
    viewer = Client()
    viewer.force_login(vera.user)
    assert viewer.post("/tokens/", {"name": "x", "scopes": ["read"]}).status_code == 403
    outsider = Client()
    outsider.force_login(charlie.user)
    token = ApiToken.objects.filter(org=alice.org).first()
    assert outsider.post(f"/tokens/{token.pk}/revoke/").status_code == 404
    token.refresh_from_db()
    assert token.revoked_at is None


@pytest.mark.django_db
def test_audit_page_filters_and_hides_other_tenants(web, alice, charlie):
    AuditEvent.objects.create(actor="user:1", org=alice.org, action="route.create", object_type="route", object_id="1")
    AuditEvent.objects.create(actor="user:2", org=charlie.org, action="route.secret", object_type="route",
                              object_id="2")
    page = web.get("/audit/", {"action": "route."}).content.decode()
    assert "route.create" in page and "route.secret" not in page
    partial = web.get("/audit/", {"action": "route.create"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in partial and "route.create" in partial
