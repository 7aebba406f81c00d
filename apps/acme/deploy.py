"""Where a certificate serves, rolling it out, and proof that every node serves the new one: a TLS
handshake per node and listener, comparing the serial the node presents with the issued one."""

from __future__ import annotations

import contextlib
import socket
import ssl
import time
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cryptography import x509
from django.db import connection, connections, transaction

from apps.balancers.models import Listener, LoadBalancer
from apps.fleets.models import Certificate, Node
from apps.fleets.selectors import lb_fleets
from apps.fleets.services import fleet_settle


@dataclass(frozen=True)
class Endpoint:
    key: str  # "fleet/node lb.listener"
    address: str
    port: int


def endpoints(cert: Certificate) -> list[Endpoint]:
    out = []
    listeners = Listener.objects.filter(certificate=cert, protocol=Listener.Protocol.HTTPS).select_related(
        "lb", "static_ip")
    for ln in listeners:
        for node in Node.objects.filter(fleet__in=lb_fleets(ln.lb), enabled=True).select_related("fleet"):
            address = node.bind_address or (ln.static_ip.address if ln.static_ip else node.address)
            out.append(Endpoint(f"{node.fleet.name}/{node.name} {ln.lb.name}.{ln.name}", address, ln.port))
    return sorted(out, key=lambda e: e.key)


def endpoints_of(certificates: list[Certificate]) -> dict[int, list[Endpoint]]:
    """endpoints() of many certificates with two queries: {certificate id: endpoints}."""
    listeners = list(Listener.objects.filter(certificate__in=certificates, protocol=Listener.Protocol.HTTPS)
                     .select_related("lb", "static_ip"))
    lbs = {ln.lb_id: ln.lb for ln in listeners}
    fleets_of = {lb_id: [f.pk for f in lb_fleets(lb)] for lb_id, lb in lbs.items()}
    wanted = {f for ids in fleets_of.values() for f in ids}
    nodes: dict[int, list[Node]] = {}
    for node in Node.objects.filter(fleet__in=wanted, enabled=True).select_related("fleet"):
        nodes.setdefault(node.fleet_id, []).append(node)
    out: dict[int, list[Endpoint]] = {}
    for ln in listeners:
        for fleet_id in fleets_of[ln.lb_id]:
            for node in nodes.get(fleet_id, []):
                address = node.bind_address or (ln.static_ip.address if ln.static_ip else node.address)
                out.setdefault(ln.certificate_id, []).append(
                    Endpoint(f"{node.fleet.name}/{node.name} {ln.lb.name}.{ln.name}", address, ln.port))
    return {cert_id: sorted(eps, key=lambda e: e.key) for cert_id, eps in out.items()}


def where_used(cert: Certificate) -> list[str]:
    return sorted({f"{ln.lb.name}.{ln.name}" for ln in cert.listeners.select_related("lb")})


def handshake_serial(address: str, port: int, server_name: str, timeout_s: float = 2.0) -> int:
    """The serial of the certificate a TLS server presents (no trust check: we compare serials)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    with socket.create_connection((address, port), timeout=timeout_s) as raw, \
            ctx.wrap_socket(raw, server_hostname=server_name) as tls:
        der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


@dataclass(frozen=True)
class Check:
    """Every endpoint where a certificate serves, the serial it must show, the name to ask for (SNI)."""

    endpoints: list[Endpoint]
    serial: int
    server_name: str


def verify_serials(checks: list[Check], timeout_s: float = 30.0,
                   verified_at: list[float | None] | None = None) -> list[dict[str, str]]:
    """For each check {endpoint: "ok" | what it served instead}, waiting up to timeout_s for every node
    to serve the serial. All handshakes of all checks run together (network only, no database).
    `verified_at`, when given, receives per check the time.time() its last endpoint showed the serial
    (None: not everywhere in time)."""
    probes = [(i, ep, check.serial, check.server_name) for i, check in enumerate(checks) for ep in check.endpoints]
    seen: list[dict[str, str]] = [{} for _ in checks]
    done_at: list[float | None] = [None if check.endpoints else time.time() for check in checks]
    deadline = time.monotonic() + timeout_s

    def probe(item: tuple[int, Endpoint, int, str]) -> str:
        _, ep, serial, server_name = item
        try:
            got = handshake_serial(ep.address, ep.port, server_name)
        except (OSError, ssl.SSLError) as exc:
            return f"handshake failed: {exc}"
        return "ok" if got == serial else f"still serves serial {got:X}"

    pending = probes
    with ThreadPoolExecutor(max_workers=max(1, min(32, len(probes)))) as pool:
        while pending:
            results = list(pool.map(probe, pending))
            for (i, ep, _, _), result in zip(pending, results, strict=True):
                seen[i][ep.key] = result
            pending = [item for item, result in zip(pending, results, strict=True) if result != "ok"]
            now, waiting = time.time(), {i for i, _, _, _ in pending}
            done_at = [at if at is not None or i in waiting else now for i, at in enumerate(done_at)]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    if verified_at is not None:
        verified_at[:] = done_at
    return seen


# --- roll out ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def turn(fleet_ids: list[int]) -> Iterator[None]:
    """One ACME deployment at a time per fleet, whichever worker or host runs it: a second one waits for
    its turn (PostgreSQL session advisory locks, taken in fleet order so two deployments sharing fleets
    cannot deadlock; a killed worker's connection releases them). Its rollout then follows the first
    instead of contending for the fleet's lease. SQLite: one writer at a time already, nothing to take."""
    if connection.vendor != "postgresql" or not fleet_ids:
        yield
        return
    keys = [zlib.crc32(f"acme.deploy:{fleet_id}".encode()) & 0x7FFFFFFF for fleet_id in sorted(set(fleet_ids))]
    taken = []
    try:
        with connection.cursor() as cur:
            for key in keys:
                cur.execute("SELECT pg_advisory_lock(%s)", [key])
                taken.append(key)
        yield
    finally:
        with connection.cursor() as cur:
            for key in reversed(taken):
                cur.execute("SELECT pg_advisory_unlock(%s)", [key])


def roll_out(certificates: list[Certificate]) -> None:
    """Render and push, once, every fleet using one of `certificates`, and return once each has rolled
    out (fleets.settle: after a rollout already in flight there, never beside it). A fleet whose
    configuration only gained new certificate contents takes them through `set/commit ssl cert` without
    a reload (fleets.node.apply). The lb_changed signal queued the same work; whichever runs second finds
    it done."""
    lbs = LoadBalancer.objects.filter(listeners__certificate__in=certificates).distinct()
    fleet_ids = sorted({f.pk for lb in lbs for f in lb_fleets(lb)})
    # Storing them touched each LB (lb_touch), whose signal recorded the change on its fleets once the
    # transaction committed; inside a caller's transaction (a test's) that has not happened yet.
    in_transaction = transaction.get_connection().in_atomic_block
    with turn(fleet_ids):
        if len(fleet_ids) < 2 or in_transaction:
            # Inside a transaction another thread's connection would not see the certificates just
            # stored: one fleet after the other.
            for fleet_id in fleet_ids:
                fleet_settle(fleet_id=fleet_id, record=in_transaction)
            return

        def settle(fleet_id: int) -> None:  # each fleet in its own thread and database connection
            try:
                fleet_settle(fleet_id=fleet_id, record=False)
            finally:
                connections.close_all()

        with ThreadPoolExecutor(max_workers=len(fleet_ids)) as pool:
            list(pool.map(settle, fleet_ids))
