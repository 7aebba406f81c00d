"""Where a certificate serves, and proof that every node serves the new one: a TLS handshake per node
and listener, comparing the serial the node presents with the issued one."""

from __future__ import annotations

import socket
import ssl
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from cryptography import x509

from apps.balancers.models import Listener
from apps.fleets.models import Certificate, Node
from apps.fleets.selectors import lb_fleets


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


def verify_serial(cert: Certificate, serial: int, server_name: str, timeout_s: float = 30.0) -> dict[str, str]:
    """{endpoint: "ok" | what it served instead}, waiting up to timeout_s for every node to serve `serial`."""
    targets = endpoints(cert)
    seen: dict[str, str] = {}
    deadline = time.monotonic() + timeout_s

    def probe(ep: Endpoint) -> str:
        try:
            got = handshake_serial(ep.address, ep.port, server_name)
        except (OSError, ssl.SSLError) as exc:
            return f"handshake failed: {exc}"
        return "ok" if got == serial else f"still serves serial {got:X}"

    pending = targets
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(targets)))) as pool:
        while pending:
            results = dict(zip((ep.key for ep in pending), pool.map(probe, pending), strict=True))
            seen.update(results)
            pending = [ep for ep in pending if results[ep.key] != "ok"]
            if not pending or time.monotonic() > deadline:
                break
            time.sleep(0.1)
    return seen
