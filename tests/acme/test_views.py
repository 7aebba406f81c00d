"""Certificates page (server-rendered) and the expiry events."""

from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from apps.acme import services
from apps.acme.models import ManagedCertificate
from apps.acme.selectors import expiry_class
from apps.audit.models import AuditEvent
from apps.balancers.models import HostnameClaim
from apps.core import crypto
from apps.events.models import Event
from apps.fleets.models import Certificate
from tests.personas import web

pytestmark = pytest.mark.django_db



def _cert(org, name: str, days_left: float, issuer: str = "CN=Pebble Intermediate CA") -> Certificate:
    now = timezone.now()
    return Certificate.objects.create(org=org, name=name, cert_pem="-", key_encrypted=crypto.encrypt("-"),
                                      issuer=issuer, dns_names=[f"{name}.acme.test"],
                                      not_before=now - dt.timedelta(days=10),
                                      not_after=now + dt.timedelta(days=days_left))


def test_expiry_colour_follows_days_left() -> None:
    assert [expiry_class(d) for d in (None, -1, 0, 13, 14, 29, 30, 80)] == [
        "warn", "bad", "bad", "bad", "warn", "warn", "ok", "ok"]


def test_the_page_shows_issuer_sans_expiry_colour_use_and_the_last_error_and_renews(alice, charlie) -> None:
    soon = _cert(alice.org, "soon", 5.5)
    claim = HostnameClaim.objects.create(org=alice.org, hostname="soon.acme.test", status="approved")
    ManagedCertificate.objects.create(org=alice.org, name="soon", certificate=soon, hostnames=["soon.acme.test"],
                                      status="failed", last_attempt_at=timezone.now(),
                                      last_error="The CA could not validate soon.acme.test: Connection refused")
    _cert(alice.org, "fine", 60)
    _cert(charlie.org, "theirs", 60)
    body = web(alice).get("/certificates/").content.decode()
    assert "CN=Pebble Intermediate CA" in body and "soon.acme.test" in body and "fine.acme.test" in body
    assert 'badge-bad expiry">' in body and "5 days left" in body and 'badge-ok expiry">' in body
    assert "The CA could not validate soon.acme.test: Connection refused" in body
    assert "theirs" not in body  # another org's certificate is not listed
    assert "Orders in the last 3 hours: 0 of 300" in body
    managed = ManagedCertificate.objects.get(name="soon")
    assert web(charlie).post(f"/certificates/{managed.pk}/renew/").status_code == 404
    assert web(alice).post(f"/certificates/{managed.pk}/renew/").status_code == 302
    managed.refresh_from_db()
    assert managed.next_attempt_at is not None and managed.next_attempt_at <= timezone.now()
    # The claim it relied on is gone: renewing now is refused, in words, and nothing is ordered.
    ManagedCertificate.objects.filter(pk=managed.pk).update(next_attempt_at=None)
    claim.delete()
    refused = web(alice).post(f"/certificates/{managed.pk}/renew/")
    assert refused.status_code == 422 and "not covered by an approved hostname claim" in refused.content.decode()
    managed.refresh_from_db()
    assert managed.next_attempt_at is None


def test_a_certificate_under_14_days_raises_one_event_a_day(alice) -> None:
    soon = _cert(alice.org, "soon", 3)
    _cert(alice.org, "fine", 20)
    assert services.expiring_alerts() == [soon.pk]
    assert services.expiring_alerts() == []  # not again the same day
    event = Event.objects.get(type="certificate.expiring")
    assert event.org == alice.org and event.object_id == str(soon.pk) and event.data["days"] == 2
    assert services.expiring_alerts(now=timezone.now() + dt.timedelta(days=1, minutes=1)) == [soon.pk]


def test_a_managed_certificate_is_requested_through_the_form_like_the_api(alice) -> None:
    """GIVEN approved claims, WHEN alice types the names one per line in the form, THEN the certificate is
    requested (audited, due at once) and listed as not issued yet."""
    HostnameClaim.objects.create(org=alice.org, hostname="shop.acme.test", status="approved")
    HostnameClaim.objects.create(org=alice.org, hostname="*.shop.acme.test", status="approved")
    client = web(alice)
    assert 'id="request-certificate"' in client.get("/certificates/").content.decode()
    form = client.get("/certificates/request/").content.decode()
    assert 'name="hostnames"' in form and '<option value="dns-01"' in form

    answer = client.post("/certificates/request/", {"name": "shop", "challenge": "http-01",
                                                 "hostnames": "shop.acme.test\r\nwww.shop.acme.test, "})

    assert answer.status_code == 302 and answer["Location"] == "/certificates/"
    managed = ManagedCertificate.objects.get(org=alice.org, name="shop")
    assert managed.hostnames == ["shop.acme.test", "www.shop.acme.test"] and managed.challenge == "http-01"
    assert managed.next_attempt_at is not None
    assert AuditEvent.objects.filter(action="acme.request", org=alice.org).count() == 1
    page = client.get("/certificates/").content.decode()
    assert "shop.acme.test, www.shop.acme.test" in page and "not issued yet" in page


def test_the_form_refuses_another_orgs_hostname_and_a_wildcard_over_http01_next_to_the_field(
        alice, charlie, vera) -> None:
    HostnameClaim.objects.create(org=alice.org, hostname="shop.acme.test", status="approved")
    HostnameClaim.objects.create(org=alice.org, hostname="*.shop.acme.test", status="approved")

    foreign = web(charlie).post("/certificates/request/", {"name": "x", "hostnames": "shop.acme.test"})
    wildcard = web(alice).post("/certificates/request/", {"name": "w", "challenge": "http-01",
                                                           "hostnames": "*.shop.acme.test"})

    assert foreign.status_code == 422
    assert ('id="f-hostnames-err" class="field-error">&#x27;shop.acme.test&#x27; is not covered by an approved '
            "hostname claim of your organization.") in foreign.content.decode()
    assert wildcard.status_code == 422
    assert 'id="f-challenge-err" class="field-error">A wildcard certificate can only be validated with dns-01.' \
        in wildcard.content.decode()
    assert web(vera).post("/certificates/request/", {"name": "v", "hostnames": "shop.acme.test"}).status_code == 403
    assert not ManagedCertificate.objects.exists()
