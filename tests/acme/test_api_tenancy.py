"""The managed-certificates API: tenancy contract, claims, renew now."""

from __future__ import annotations

import pytest
from django.utils import timezone

from apps.acme.models import ManagedCertificate
from apps.audit.models import AuditEvent
from tests.acme.acmekit import approve
from tests.api_contract import TenancyContract


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


def _upload(org, name: str, host: str):
    from apps.core import crypto
    from apps.fleets.models import Certificate
    from tests.fleets.fleetkit import self_signed

    cert_pem, key_pem = self_signed(30, host)
    return Certificate.objects.create(org=org, name=name, cert_pem=cert_pem, key_encrypted=crypto.encrypt(key_pem),
                                      dns_names=[host])


@pytest.mark.django_db
def test_an_uploaded_certificate_is_taken_over_only_by_its_own_org_and_only_once(alice, charlie) -> None:
    """The way from a hand-uploaded certificate to a managed one: the managed certificate takes the
    uploaded row over (renewed in place, so listeners using it switch with no reload). Another org's
    certificate answers like a missing one; a certificate already managed is refused."""
    approve(alice.org, "shop.acme.test")
    approve(charlie.org, "globex.test")
    mine, theirs = _upload(alice.org, "shop", "shop.acme.test"), _upload(charlie.org, "g", "globex.test")
    url = "/api/v1/managed-certificates/"

    foreign = alice.client.post(url, {"name": "x", "hostnames": ["shop.acme.test"], "certificate": theirs.pk},
                                format="json")
    missing = alice.client.post(url, {"name": "x", "hostnames": ["shop.acme.test"], "certificate": 999999},
                                format="json")
    assert foreign.status_code == missing.status_code == 400
    assert foreign.json()["fields"].keys() == missing.json()["fields"].keys() == {"certificate"}
    # its own name is not taken by the certificate it takes over
    taken = alice.client.post(url, {"name": "shop", "hostnames": ["shop.acme.test"], "certificate": mine.pk},
                              format="json")
    assert taken.status_code == 201, taken.json()
    assert taken.json()["certificate"] == mine.pk
    assert ManagedCertificate.objects.get(pk=taken.json()["id"]).certificate_id == mine.pk
    again = alice.client.post(url, {"name": "shop2", "hostnames": ["shop.acme.test"], "certificate": mine.pk},
                              format="json")
    assert again.status_code == 409 and again.json()["code"] == "already_managed"
    moved = alice.client.patch(f"{url}{taken.json()['id']}/", {"certificate": None}, format="json")
    assert moved.status_code == 400


@pytest.mark.django_db
def test_a_requested_certificate_is_ordered_together_with_the_others_due(alice, monkeypatch) -> None:
    """The task queued by one API request takes every due certificate with it (one render and push per
    fleet for all of them), and the tasks queued by the others find nothing left to do."""
    from apps.acme import services, tasks

    for i in range(3):
        approve(alice.org, f"s{i}.acme.test")
    batches: list[list[int]] = []
    monkeypatch.setattr(services, "managed_certificates_issue",
                        lambda *, managed_ids, force=False: batches.append(managed_ids) or [])
    managed = [ManagedCertificate.objects.create(org=alice.org, name=f"s{i}", hostnames=[f"s{i}.acme.test"],
                                                 next_attempt_at=timezone.now()) for i in range(3)]
    tasks.issue_certificate_task(managed[1].pk)
    assert batches == [[managed[1].pk, managed[0].pk, managed[2].pk]]
