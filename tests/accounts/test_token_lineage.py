"""Tokens minted by tokens never outlive, outrank or survive their parent; no secret is kept in clear."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.accounts.services import token_create
from apps.core.models import IdempotencyRecord

pytestmark = pytest.mark.django_db
URL = "/api/v1/tokens/"


def _client(secret: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    return client


def test_a_short_lived_token_cannot_mint_a_permanent_one(alice):
    parent = token_create(org=alice.org, name="ten-minutes", scopes=["read", "write"], user=alice.user,
                          expires_at=timezone.now() + timedelta(minutes=10))
    as_parent = _client(parent.secret)

    later = as_parent.post(URL, {"name": "forever", "scopes": ["read"],
                                 "expires_at": (timezone.now() + timedelta(days=365)).isoformat()}, format="json")
    default = as_parent.post(URL, {"name": "no-expiry-given", "scopes": ["read"]}, format="json")

    assert later.status_code == 400 and later.json()["code"] == "expiry_exceeds_parent"
    assert default.status_code == 201, default.content
    child = ApiToken.objects.get(pk=default.json()["id"])
    assert child.expires_at == parent.token.expires_at
    assert child.parent_id == parent.token.pk and child.user_id == alice.user.pk


def test_a_child_cannot_have_scopes_its_parent_lacks(alice):
    parent = token_create(org=alice.org, name="read-write", scopes=["read", "write"], user=alice.user)
    response = _client(parent.secret).post(URL, {"name": "deployer", "scopes": ["read", "deploy"]}, format="json")
    assert response.status_code == 403 and response.json()["code"] == "scope_exceeds_parent"
    assert not ApiToken.objects.filter(name="deployer").exists()


def test_revoking_a_parent_revokes_every_descendant(alice):
    parent = token_create(org=alice.org, name="root", scopes=["read", "write"], user=alice.user)
    child = _client(parent.secret).post(URL, {"name": "child", "scopes": ["read", "write"]}, format="json").json()
    grandchild = _client(child["token"]).post(URL, {"name": "grandchild", "scopes": ["read"]}, format="json").json()
    assert _client(grandchild["token"]).get("/api/v1/load-balancers/").status_code == 200

    assert alice.client.post(f"{URL}{parent.token.pk}/revoke/").status_code == 200

    for secret in (parent.secret, child["token"], grandchild["token"]):
        assert _client(secret).get("/api/v1/load-balancers/").status_code == 401


def test_an_idempotent_replay_never_returns_the_secret_again_and_none_is_stored(alice):
    headers = {"HTTP_IDEMPOTENCY_KEY": "mint-1"}
    first = alice.client.post(URL, {"name": "ci", "scopes": ["read"]}, format="json", **headers)
    replay = alice.client.post(URL, {"name": "ci", "scopes": ["read"]}, format="json", **headers)

    secret = first.json()["token"]
    assert first.status_code == replay.status_code == 201
    assert replay["Idempotent-Replayed"] == "true"
    assert replay.json()["id"] == first.json()["id"] and replay.json()["token"] is None
    assert secret not in str(list(IdempotencyRecord.objects.values_list("body", flat=True)))
