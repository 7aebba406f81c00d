"""Certificates page (server-rendered) and the expiry events."""

from __future__ import annotations

import datetime as dt

import pytest
from django.test import Client
from django.utils import timezone

from apps.acme import services
from apps.acme.models import ManagedCertificate
from apps.acme.selectors import expiry_class
from apps.core import crypto
from apps.events.models import Event
from apps.fleets.models import Certificate

pytestmark = pytest.mark.django_db


def _web(persona) -> Client:
    client = Client()
    client.force_login(persona.user)
    return client


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
    ManagedCertificate.objects.create(org=alice.org, name="soon", certificate=soon, hostnames=["soon.acme.test"],
                                      status="failed", last_attempt_at=timezone.now(),
                                      last_error="The CA could not validate soon.acme.test: Connection refused")
    _cert(alice.org, "fine", 60)
    _cert(charlie.org, "theirs", 60)
    body = _web(alice).get("/certificates/").content.decode()
    assert "CN=Pebble Intermediate CA" in body and "soon.acme.test" in body and "fine.acme.test" in body
    assert 'badge-bad expiry">' in body and "5 days left" in body and 'badge-ok expiry">' in body
    assert "The CA could not validate soon.acme.test: Connection refused" in body
    assert "theirs" not in body  # another org's certificate is not listed
    assert "Orders in the last 3 hours: 0 of 300" in body
    managed = ManagedCertificate.objects.get(name="soon")
    assert _web(charlie).post(f"/certificates/{managed.pk}/renew/").status_code == 404
    assert _web(alice).post(f"/certificates/{managed.pk}/renew/").status_code == 302
    managed.refresh_from_db()
    assert managed.next_attempt_at is not None and managed.next_attempt_at <= timezone.now()


def test_a_certificate_under_14_days_raises_one_event_a_day(alice) -> None:
    soon = _cert(alice.org, "soon", 3)
    _cert(alice.org, "fine", 20)
    assert services.expiring_alerts() == [soon.pk]
    assert services.expiring_alerts() == []  # not again the same day
    event = Event.objects.get(type="certificate.expiring")
    assert event.org == alice.org and event.object_id == str(soon.pk) and event.data["days"] == 2
    assert services.expiring_alerts(now=timezone.now() + dt.timedelta(days=1, minutes=1)) == [soon.pk]
