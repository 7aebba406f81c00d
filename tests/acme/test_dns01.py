"""DNS-01 through RFC 2136 dynamic updates against Knot DNS on loopback, with pebble resolving through it."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import dns.message
import dns.query
import pytest
from cryptography import x509

from apps.acme import services
from apps.acme.models import ManagedCertificate
from apps.fleets.models import Certificate
from tests.acme.acmekit import approve, principal_of
from tests.acme.pebblekit import Knot, Pebble
from tests.netutil import pick_free_port

pytestmark = [pytest.mark.django_db]


@pytest.fixture(scope="module")
def knot() -> Iterator[Knot]:
    if not shutil.which("knotd") and not shutil.which("/usr/sbin/knotd"):
        pytest.skip("knot is not installed (apt-get install knot)")
    server = Knot(zone="acme.test").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def pebble_via_knot(knot: Knot) -> Iterator[Pebble]:
    ca = Pebble(http_port=pick_free_port(), dns_server=f"127.0.0.1:{knot.port}").start()
    try:
        yield ca
    finally:
        ca.stop()


def _txt(knot: Knot, name: str) -> list[str]:
    answer = dns.query.udp(dns.message.make_query(name, "TXT"), "127.0.0.1", port=knot.port, timeout=2)
    return [r.to_text() for rrset in answer.answer for r in rrset]


def test_a_wildcard_certificate_is_issued_through_rfc2136_updates(settings, knot, pebble_via_knot, alice) -> None:
    settings.ACME_DIRECTORY_URL = pebble_via_knot.directory_url
    settings.ACME_CA_BUNDLE = pebble_via_knot.ca_bundle
    settings.ACME_DNS_PROVIDER = knot.provider_settings()
    approve(alice.org, "*.shop.acme.test")
    managed = services.managed_certificate_request(principal=principal_of(alice), name="wild",
                                                   hostnames=["*.shop.acme.test"], challenge="dns-01")
    order = services.managed_certificate_issue(managed_id=managed.pk)
    assert order.status == "valid", order.error
    managed.refresh_from_db()
    assert managed.status == ManagedCertificate.Status.VALID
    cert = Certificate.objects.get(pk=managed.certificate_id)
    leaf = x509.load_pem_x509_certificates(cert.cert_pem.encode())[0]
    san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["*.shop.acme.test"]
    assert _txt(knot, "_acme-challenge.shop.acme.test.") == []  # cleaned up after the order


def test_a_wildcard_cannot_use_http01_and_a_refused_update_is_reported(settings, knot, pebble_via_knot,
                                                                      alice) -> None:
    approve(alice.org, "*.shop.acme.test")
    with pytest.raises(Exception) as caught:
        services.managed_certificate_request(principal=principal_of(alice), name="w", hostnames=["*.shop.acme.test"])
    assert caught.value.code == "wildcard_needs_dns"
    settings.ACME_DIRECTORY_URL = pebble_via_knot.directory_url
    settings.ACME_CA_BUNDLE = pebble_via_knot.ca_bundle
    settings.ACME_DNS_PROVIDER = {**knot.provider_settings(), "key_secret": "d3JvbmctdHNpZy1rZXk="}
    managed = services.managed_certificate_request(principal=principal_of(alice), name="w2",
                                                   hostnames=["*.shop.acme.test"], challenge="dns-01")
    order = services.managed_certificate_issue(managed_id=managed.pk)
    assert order.status == "failed" and order.error_code in {"dns_update_refused", "dns_update_failed"}, order.error
    assert "DNS" in order.error
