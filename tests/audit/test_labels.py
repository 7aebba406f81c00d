"""Audit entries read as people talk: "alice (acme)", "token ci-deploy (acme)", "rollout 5 …"."""

from __future__ import annotations

import pytest
from django.test import Client
from rest_framework.test import APIClient

from apps.accounts.services import principal_for_user, token_create
from apps.audit.models import AuditEvent
from apps.audit.services import audit_record
from tests.factories import LoadBalancerFactory, PoolFactory


@pytest.fixture
def pool(acme):
    return PoolFactory(lb=LoadBalancerFactory(name="acme-lb", org=acme), org=acme, name="web")


@pytest.mark.django_db
def test_user_and_token_writes_are_labelled_by_name(pool, alice):
    token = token_create(org=alice.org, name="ci-deploy", scopes=["read", "write"], user=None).secret
    alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"algorithm": "leastconn"}, format="json")
    ci = APIClient()
    ci.credentials(HTTP_AUTHORIZATION=f"Bearer {token}")
    assert ci.patch(f"/api/v1/pools/{pool.pk}/", {"algorithm": "source"},
                    format="json").status_code == 200
    labels = list(AuditEvent.objects.filter(action="pool.update").order_by("id").values_list("actor_label", flat=True))
    assert labels == ["token alice-token (acme)", "token ci-deploy (acme)"]


@pytest.mark.django_db
def test_ui_audit_page_shows_names_and_filters_by_them(pool, alice, bob):
    browser = Client()
    browser.force_login(bob.user)

    principal = principal_for_user(bob.user)
    audit_record(principal=principal, org=bob.org, action="pool.update", obj=pool)
    page = browser.get("/audit/").content.decode()
    assert "bob (acme)" in page
    assert "user:" not in page.split("<tbody>")[1].split("</tbody>")[0].replace('title="user:', "")
    filtered = browser.get("/audit/", {"actor": "bob"}).content.decode()
    assert "bob (acme)" in filtered


@pytest.mark.django_db
def test_rollout_row_does_not_repeat_its_type(pool, bob):
    # As the fleets services record a rollout: object type "rollout", its own text "rollout 5 edge@3 …".
    AuditEvent.objects.create(actor="system", actor_label="system", org=bob.org, action="rollout.finish",
                              object_type="rollout", object_id="5", object_repr="rollout 5 edge@3 succeeded")
    AuditEvent.objects.create(actor="system", org=bob.org, action="pool.update", object_type="pool",
                              object_id=str(pool.pk), object_repr="web")
    browser = Client()
    browser.force_login(bob.user)
    page = browser.get("/audit/").content.decode()
    assert "rollout 5 edge@3 succeeded" in page
    assert "rollout rollout" not in page
    assert "pool web" in page
