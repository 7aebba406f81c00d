"""A certificate-only change (a renewal: same listeners, same pools) reaches running nodes through the
runtime API (`set/commit ssl cert`, proven by `show ssl cert`'s serial) without a reload, without the
listener probes and `show stat` of a full verification, and with the new file on disk for the next
reload; a failure falls back to the reload path, and a certificate HAProxy refuses leaves the old one
serving."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from cryptography import x509

from apps.acme.deploy import handshake_serial
from apps.core import crypto
from apps.fleets import selectors, services
from apps.fleets.config import certificates as certs
from apps.fleets.models import Certificate, NodeResult, Rollout
from apps.fleets.node import apply as delivery
from apps.fleets.node.apply import transport_of
from apps.fleets.node.runtime_api import HAProxySocket, RuntimeApiError
from tests.fleets.fleetkit import LocalFleet, changed, make_local_fleet, reconcile, self_signed
from tests.netutil import free_port_on

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]

HOST = "hot.acme.example"


@pytest.fixture
def tls_fleet(haproxy_bin, tiny_backend) -> Iterator[tuple[LocalFleet, Certificate, int]]:
    """3 nodes serving an https listener with a certificate, rolled out (the listener's first render reloads)."""
    backend = tiny_backend("web")
    local = make_local_fleet(name="hotcert", subnet=78, node_count=3, backend_address=(backend.address, backend.port))
    try:
        cert_pem, key_pem = self_signed(30, HOST)
        cert = certs.certificate_save(principal=None, cert=Certificate(org=local.lb.org), org=local.lb.org,
                                      name="hot", cert_pem=cert_pem, key_pem=key_pem, touch_lbs=False)
        port = free_port_on([n.bind_address for n in local.nodes])
        local.lb.listeners.create(name="tls", protocol="https", port=port, default_pool=local.listener.default_pool,
                                  certificate=cert)
        reconcile(local.fleet)
        assert all(n.applied_revision_id for n in local.nodes)
        yield local, cert, port
    finally:
        local.stop_all()


def _serial(cert: Certificate) -> int:
    return x509.load_pem_x509_certificate(cert.cert_pem.encode()).serial_number


def _workers(local: LocalFleet) -> dict[str, tuple[int | None, int]]:
    """Per node: (current worker PID, reloads the master has processed), from `show proc`."""
    out = {}
    for node in local.nodes:
        transport = transport_of(selectors.node_conn(node))
        try:
            proc = transport.show_proc()
        finally:
            transport.close()
        out[node.name] = (proc.current_worker.pid if proc.current_worker else None, proc.master_reloads)
    return out


def _renew(cert: Certificate) -> Certificate:
    """A new certificate for the same name, stored in place (what an ACME renewal does)."""
    cert_pem, key_pem = self_signed(30, HOST)
    return certs.certificate_save(principal=None, cert=cert, org=cert.org, name=cert.name, cert_pem=cert_pem,
                                  key_pem=key_pem, touch_lbs=False)


def _results(local: LocalFleet) -> list[NodeResult]:
    rollout = Rollout.objects.filter(fleet=local.fleet).order_by("-id").first()
    return list(rollout.results.order_by("node__name"))


def test_a_renewed_certificate_reaches_every_node_without_a_reload_or_listener_probes(tls_fleet, monkeypatch) -> None:
    local, cert, port = tls_fleet
    before = _workers(local)
    probed = []
    monkeypatch.setattr(delivery, "verify", lambda *args: probed.append(args) or None)
    old_serial = _serial(cert)

    cert = _renew(cert)
    reconcile(local.fleet)

    new_serial = _serial(cert)
    assert new_serial != old_serial
    results = _results(local)
    assert [r.status for r in results] == ["succeeded"] * 3, [r.error for r in results]
    assert all(r.reload_ms is None for r in results)
    assert probed == []  # proven by `show ssl cert`'s serial alone
    assert _workers(local) == before  # same worker, not one reload processed by any master
    for node in local.nodes:
        assert handshake_serial(node.bind_address, port, HOST) == new_serial, node.name
        live = HAProxySocket(f"{node.runtime_dir}/stats.sock").ssl_cert_serial(f"certs/cert-{cert.pk}.pem")
        assert int(live, 16) == new_serial

    # On disk too: the next reload (any config change) serves the new certificate, not the old one.
    monkeypatch.undo()
    for node in local.nodes:
        transport = transport_of(selectors.node_conn(node))
        try:
            assert transport.activate(10).ok
        finally:
            transport.close()
    assert {pid for pid, _ in _workers(local).values()}.isdisjoint({pid for pid, _ in before.values()})
    for node in local.nodes:
        assert handshake_serial(node.bind_address, port, HOST) == new_serial, node.name


def test_a_certificate_the_runtime_api_fails_to_take_is_served_through_a_reload(tls_fleet, monkeypatch) -> None:
    """GIVEN the runtime API failing on `set ssl cert` (e.g. a socket timeout) WHEN a renewal rolls out
    THEN each node falls back to the normal path: a reload of the pushed files, fully verified."""
    local, cert, port = tls_fleet
    before = _workers(local)

    def refuse(self, name, pem):  # type: ignore[no-untyped-def]
        raise RuntimeApiError(f"set ssl cert {name}", "simulated failure")

    monkeypatch.setattr(HAProxySocket, "set_ssl_cert", refuse)
    cert = _renew(cert)
    reconcile(local.fleet)

    results = _results(local)
    assert [r.status for r in results] == ["succeeded"] * 3, [r.error for r in results]
    assert all(r.reload_ms is not None for r in results)
    assert all("runtime update failed" in r.error and "reloading instead" in r.error for r in results)
    after = _workers(local)
    assert all(after[name][0] != before[name][0] for name in before)  # reloaded
    for node in local.nodes:
        assert handshake_serial(node.bind_address, port, HOST) == _serial(cert), node.name


def test_a_certificate_haproxy_refuses_leaves_the_old_one_serving(tls_fleet) -> None:
    """GIVEN a stored certificate whose key does not match it (written past the upload checks) WHEN it
    rolls out THEN `set ssl cert` is refused and aborted, the reload it falls back to fails too and the
    node is rolled back: every node still serves the old certificate."""
    local, cert, port = tls_fleet
    old_serial = _serial(cert)
    other_pem, _ = self_signed(30, HOST)
    _, other_key = self_signed(30, HOST)
    Certificate.objects.filter(pk=cert.pk).update(cert_pem=other_pem, key_encrypted=crypto.encrypt(other_key))
    changed(local.fleet)
    services.fleet_reconcile(fleet_id=local.fleet.pk)

    rollout = Rollout.objects.filter(fleet=local.fleet).order_by("-id").first()
    assert rollout.status == "failed"
    for result in rollout.results.all():
        assert "runtime update failed" in result.error, result.error
    for node in local.nodes:
        assert handshake_serial(node.bind_address, port, HOST) == old_serial, node.name
        stats = HAProxySocket(f"{node.runtime_dir}/stats.sock")
        assert int(stats.ssl_cert_serial(f"certs/cert-{cert.pk}.pem"), 16) == old_serial
