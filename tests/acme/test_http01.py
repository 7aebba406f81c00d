"""HTTP-01 issuance against a real ACME CA (pebble) through a real 2-region HAProxy fleet."""

from __future__ import annotations

import datetime as dt

import pytest
from cryptography import x509

from apps.acme import services
from apps.acme.client import Challenge
from apps.acme.deploy import handshake_serial
from apps.acme.models import AcmeAccount, ManagedCertificate
from apps.acme.services import FleetHttp01Solver
from apps.core.errors import DomainError
from apps.fleets.models import Certificate
from apps.fleets.node.apply import pem_serial
from apps.fleets.node.runtime_api import HAProxySocket
from tests.acme.acmekit import EU_NODES, approve, principal_of
from tests.netutil import http_get

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


def _challenge_answer(address: str, port: int, token: str) -> tuple[int, str]:
    return http_get(f"http://{address}:{port}/.well-known/acme-challenge/{token}")


def test_a_challenge_answer_is_served_by_every_node_of_every_region_without_a_reload(two_regions) -> None:
    pids = two_regions.worker_pids()
    solver = FleetHttp01Solver()
    challenge = Challenge("http-01", "shop.acme.test", "tok-123_abc", "tok-123_abc.thumbprint-xyz")
    solver.present([challenge])
    for node in two_regions.nodes:
        assert _challenge_answer(node.bind_address, two_regions.ports.http, "tok-123_abc") == (
            200, "tok-123_abc.thumbprint-xyz"), node.name
        # Ordinary traffic is untouched: the default pool still answers.
        assert http_get(f"http://{node.bind_address}:{two_regions.ports.http}/")[1] == "web"
    solver.cleanup([challenge])
    for node in two_regions.nodes:
        assert _challenge_answer(node.bind_address, two_regions.ports.http, "tok-123_abc")[1] == "web"
    two_regions.reconcile()
    assert two_regions.worker_pids() == pids  # no revision, no reload


def test_a_certificate_is_issued_through_a_node_in_the_other_region_and_served_after_a_renewal_with_no_reload(
        two_regions, pebble, acme_settings, alice, ops) -> None:
    """GIVEN acme's approved claim for shop.acme.test, whose DNS points at the eu-west node only
    WHEN alice asks for a certificate, THEN the CA validates through that node, the chain verifies
    against pebble's root, the key is stored encrypted; once an https listener uses it, a renewal
    reaches every node of both regions through the runtime API (handshake shows the new serial)
    and no node reloads."""
    approve(alice.org, "shop.acme.test")
    pebble.resolve("shop.acme.test", EU_NODES[0])
    managed = services.managed_certificate_request(principal=principal_of(alice), name="shop",
                                                   hostnames=["shop.acme.test"])
    order = services.managed_certificate_issue(managed_id=managed.pk)
    assert order is not None and order.status == "valid", order.error
    managed.refresh_from_db()
    assert managed.status == ManagedCertificate.Status.VALID and managed.last_error == ""
    cert = Certificate.objects.get(pk=managed.certificate_id)
    assert cert.org == alice.org and cert.dns_names == ["shop.acme.test"]
    assert "BEGIN" not in cert.key_encrypted  # encrypted at rest
    account = AcmeAccount.objects.get(org=alice.org)
    assert account.uri and "BEGIN" not in account.key_encrypted
    chain = x509.load_pem_x509_certificates(cert.cert_pem.encode())
    root = x509.load_pem_x509_certificate(pebble.root_pem().encode())
    chain[0].verify_directly_issued_by(chain[1])
    chain[-1].verify_directly_issued_by(root)
    # Renewal scheduled at 2/3 of the lifetime, minus at most 1/30 of it as jitter.
    lifetime = cert.not_after - cert.not_before
    renew_at = managed.next_attempt_at - cert.not_before
    assert lifetime * (2 / 3 - 1 / 30) <= renew_at <= lifetime * 2 / 3

    # The operator serves it on an https listener (this first change of haproxy.cfg reloads).
    https = two_regions.lb.listeners.create(name="https", protocol="https", port=two_regions.ports.https,
                                            default_pool=two_regions.http.default_pool, certificate=cert)
    assert https.pk
    two_regions.reconcile()
    pids = two_regions.worker_pids()
    old_serial = pem_serial(cert.cert_pem.encode())

    renewal = services.managed_certificate_issue(managed_id=managed.pk, force=True)
    assert renewal is not None and renewal.status == "valid", renewal.error
    cert.refresh_from_db()
    new_serial = pem_serial(cert.cert_pem.encode())
    assert new_serial != old_serial
    assert len(renewal.deployed) == 3 and set(renewal.deployed.values()) == {"ok"}, renewal.deployed
    assert two_regions.worker_pids() == pids  # hitless: not one reload
    for node in two_regions.nodes:
        stats = HAProxySocket(f"{node.runtime_dir}/stats.sock")
        assert int(stats.ssl_cert_serial(f"certs/cert-{cert.pk}.pem"), 16) == int(new_serial, 16)


def test_a_failed_challenge_is_reported_with_the_cas_reason(two_regions, pebble, acme_settings, alice) -> None:
    approve(alice.org, "lost.acme.test")
    pebble.resolve("lost.acme.test", "127.18.9.9")  # no node there: the CA's connection is refused
    managed = services.managed_certificate_request(principal=principal_of(alice), name="lost",
                                                   hostnames=["lost.acme.test"])
    order = services.managed_certificate_issue(managed_id=managed.pk)
    managed.refresh_from_db()
    assert order.status == "failed" and managed.status == ManagedCertificate.Status.FAILED
    assert managed.last_error_code == "challenge_failed"
    assert managed.last_error.startswith("The CA could not validate lost.acme.test: ")
    assert "127.18.9.9" in managed.last_error and "refused" in managed.last_error.lower()
    assert managed.failures == 1 and managed.next_attempt_at > order.finished_at  # backs off
    assert managed.certificate is None


def test_an_org_cannot_ask_for_a_certificate_for_another_orgs_hostname(acme_settings, alice, charlie) -> None:
    approve(alice.org, "shop.acme.test")
    for hostnames in (["shop.acme.test"], ["nobody.test"]):  # foreign and unclaimed answer the same
        with pytest.raises(DomainError) as caught:
            services.managed_certificate_request(principal=principal_of(charlie), name="steal", hostnames=hostnames)
        assert (caught.value.code, caught.value.status) == ("hostname_not_claimed", 422)
        assert "acme" not in caught.value.detail.replace(hostnames[0], "")
    assert not ManagedCertificate.objects.exists()


def test_a_short_lived_certificate_is_renewed_at_two_thirds_of_its_life(two_regions, pebble, acme_settings,
                                                                       alice) -> None:
    approve(alice.org, "short.acme.test")
    pebble.resolve("short.acme.test", two_regions.nodes[0].bind_address)
    managed = services.managed_certificate_request(principal=principal_of(alice), name="short",
                                                   hostnames=["short.acme.test"])
    first = services.managed_certificate_issue(managed_id=managed.pk)
    assert first.status == "valid", first.error
    managed.refresh_from_db()
    cert = managed.certificate
    assert (cert.not_after - cert.not_before).total_seconds() <= 3601  # pebble's short lifetime
    renew_at = managed.next_attempt_at
    # Not due a second early, nothing happens; at its time the beat finds it and it renews.
    assert managed.pk not in services.due(now=renew_at - dt.timedelta(seconds=1))
    assert services.managed_certificate_issue(managed_id=managed.pk, now=renew_at - dt.timedelta(seconds=1)) is None
    assert managed.pk in services.due(now=renew_at)
    second = services.managed_certificate_issue(managed_id=managed.pk, now=renew_at)
    assert second.status == "valid", second.error
    cert.refresh_from_db()
    assert second.serial != first.serial and cert.fingerprint_sha256 != "" and cert.pk == managed.certificate_id


def test_a_changed_domain_list_gets_its_new_certificate_before_the_old_one_leaves(two_regions, pebble, acme_settings,
                                                                                 alice) -> None:
    """GIVEN an issued certificate serving on an https listener, WHEN a name is added, THEN the old
    certificate keeps serving until the new one (with both names) replaces it in place, without a reload."""
    approve(alice.org, "*.two.acme.test")
    approve(alice.org, "two.acme.test")
    for name in ("two.acme.test", "www.two.acme.test"):
        pebble.resolve(name, EU_NODES[0])
    managed = services.managed_certificate_request(principal=principal_of(alice), name="two",
                                                   hostnames=["two.acme.test"])
    assert services.managed_certificate_issue(managed_id=managed.pk).status == "valid"
    managed.refresh_from_db()
    cert = managed.certificate
    two_regions.lb.listeners.create(name="https", protocol="https", port=two_regions.ports.https,
                                    default_pool=two_regions.http.default_pool, certificate=cert)
    two_regions.reconcile()
    pids = two_regions.worker_pids()
    old = handshake_serial(EU_NODES[0], two_regions.ports.https, "two.acme.test")

    services.managed_certificate_update(principal=principal_of(alice), managed=managed,
                                        hostnames=["two.acme.test", "www.two.acme.test"])
    cert.refresh_from_db()
    assert cert.dns_names == ["two.acme.test"]  # the old one still serves while the new one is ordered
    assert all(handshake_serial(n.bind_address, two_regions.ports.https, "two.acme.test") == old
               for n in two_regions.nodes)
    assert managed.pk in services.due()
    order = services.managed_certificate_issue(managed_id=managed.pk)
    assert order.status == "valid", order.error
    cert.refresh_from_db()
    assert sorted(cert.dns_names) == ["two.acme.test", "www.two.acme.test"]
    assert set(order.deployed.values()) == {"ok"} and len(order.deployed) == 3
    assert two_regions.worker_pids() == pids
