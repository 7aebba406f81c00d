"""The managed-certificates API: tenancy contract, claims, renew now."""

from __future__ import annotations

import pytest

from apps.acme.models import ManagedCertificate
from apps.audit.models import AuditEvent
from tests.api_contract import TenancyContract

from .conftest import approve


class TestManagedCertificates(TenancyContract):
    url = "/api/v1/managed-certificates/"
    update = {"hostnames": ["shop.acme.test", "www.shop.acme.test"]}

    def make(self, request):
        acme = request.getfixturevalue("acme")
        return ManagedCertificate.objects.create(org=acme, name="shop", hostnames=["shop.acme.test"])

    def payload(self, request):
        acme = request.getfixturevalue("acme")
        if not acme.hostname_claims.exists():
            approve(acme, "*.shop.acme.test")
            approve(acme, "shop.acme.test")
        return {"name": "api", "hostnames": ["shop.acme.test"]}


@pytest.mark.django_db
def test_another_orgs_hostname_answers_like_an_unclaimed_one(alice, charlie) -> None:
    approve(alice.org, "shop.acme.test")
    foreign = charlie.client.post("/api/v1/managed-certificates/", {"name": "x", "hostnames": ["shop.acme.test"]},
                                  format="json")
    unclaimed = charlie.client.post("/api/v1/managed-certificates/", {"name": "x", "hostnames": ["none.test"]},
                                    format="json")
    assert foreign.status_code == unclaimed.status_code == 422
    assert foreign.json()["code"] == unclaimed.json()["code"] == "hostname_not_claimed"
    assert not ManagedCertificate.objects.exists()


@pytest.mark.django_db
def test_renew_now_schedules_an_order_at_once_and_is_audited(alice, vera) -> None:
    approve(alice.org, "shop.acme.test")
    managed = ManagedCertificate.objects.create(org=alice.org, name="shop", hostnames=["shop.acme.test"],
                                                failures=4)
    assert vera.client.post(f"/api/v1/managed-certificates/{managed.pk}/renew/").status_code == 403
    answer = alice.client.post(f"/api/v1/managed-certificates/{managed.pk}/renew/")
    assert answer.status_code == 202
    managed.refresh_from_db()
    assert managed.failures == 0 and managed.next_attempt_at is not None
    assert AuditEvent.objects.filter(action="acme.renew_now").count() == 1
    body = alice.client.get(f"/api/v1/managed-certificates/{managed.pk}/").json()
    assert body["status"] == "pending" and body["days_left"] is None and body["where_used"] == []
