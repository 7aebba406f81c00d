"""Outbound HTTP to URLs tenants type: job failure webhooks, the http_check kind, event subscriptions.

Shared by scheduling and events (one set of guard rails and one signature scheme). Django only in
`org_policy`, which reads the deployment's allowed networks from settings.

Guard rails, because a URL typed by a tenant is fetched from inside the control plane:

* only http:// and https://, no credentials in the URL, no redirects followed;
* the host is resolved once, every address is checked, and the connection goes to the
  checked address (so DNS rebinding between check and connect cannot swap it);
* never link-local (169.254.0.0/16, fe80::/10, which holds the cloud metadata services),
  never the other known metadata addresses, multicast, unspecified or reserved ranges;
* internal addresses (loopback, RFC 1918, unique-local, CGNAT) only under a policy that
  allows them: the operator's jobs may notify receivers on the operator's own network, a
  tenant's jobs reach public addresses plus the networks the deployment lists;
* a host name that DNS can carry (RFC 1123 labels; IDNs in their xn-- form), checked when the URL is saved;
* one deadline for the whole attempt (DNS, connect, TLS, send, every read), however the receiver trickles
  (apps.core.outbound), and a bounded response read.

Signature (verify it before trusting a payload): the headers carry
``X-Spillway-Timestamp: <unix seconds>`` and
``X-Spillway-Signature: sha256=<hex HMAC-SHA256(secret, "<timestamp>." + body)>``.
A receiver recomputes the HMAC over the raw body and rejects timestamps older than a few
minutes, which stops replays.
"""

from __future__ import annotations

import hashlib
import hmac
import http.client
import ipaddress
import json
import socket
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import urlsplit

from apps.core import outbound, validators

MAX_URL_LEN: Final = 2048
MAX_TIMEOUT_S: Final = 30.0
MAX_RESPONSE_BYTES: Final = 64 * 1024
SIGNATURE_HEADER: Final = "X-Spillway-Signature"
TIMESTAMP_HEADER: Final = "X-Spillway-Timestamp"
USER_AGENT: Final = "Spillway-Webhook/1"

# Metadata services that are not link-local: AWS IMDS over IPv6, Alibaba, Oracle's legacy one.
_METADATA: Final = frozenset(
    ipaddress.ip_address(a) for a in ("fd00:ec2::254", "100.100.100.200", "192.0.0.192"))


class UnsafeUrl(ValueError):
    """The URL may not be fetched; `code` is stable for API errors."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class AddressPolicy:
    allow_internal: bool = False  # loopback, private, unique-local, CGNAT
    allow_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def with_networks(cls, cidrs: list[str] | tuple[str, ...], *, allow_internal: bool = False) -> AddressPolicy:
        return cls(allow_internal, tuple(ipaddress.ip_network(c, strict=False) for c in cidrs))


PUBLIC_ONLY: Final = AddressPolicy()
INTERNAL_TOO: Final = AddressPolicy(allow_internal=True)


def org_policy(org: Any) -> AddressPolicy:
    """Where an org may send HTTP: the operator anywhere but link-local and metadata; a tenant to public
    addresses and the networks in settings.SCHEDULING_TENANT_URL_ALLOW_CIDRS."""
    from django.conf import settings

    if org.is_operator:
        return INTERNAL_TOO
    return AddressPolicy.with_networks(getattr(settings, "SCHEDULING_TENANT_URL_ALLOW_CIDRS", []))


@dataclass(frozen=True)
class Target:
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent on the request line


@dataclass(frozen=True)
class Response:
    status: int
    body: bytes
    elapsed_ms: float
    address: str


def parse_url(url: object, policy: AddressPolicy = PUBLIC_ONLY) -> Target:
    """Check the URL's shape, and a literal IP host against `policy` (no network). Raises UnsafeUrl."""
    if not isinstance(url, str) or not url:
        raise UnsafeUrl("invalid_url", "URL must be a non-empty string.")
    if len(url) > MAX_URL_LEN:
        raise UnsafeUrl("invalid_url", f"URL is longer than {MAX_URL_LEN} characters.")
    if any(ord(c) <= 0x20 or ord(c) == 0x7F for c in url):
        raise UnsafeUrl("invalid_url", "URL must not contain spaces or control characters.")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeUrl("invalid_url", f"URL cannot be parsed: {exc}.") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeUrl("invalid_url_scheme", "Only http:// and https:// URLs are allowed.")
    if parts.username is not None or parts.password is not None:
        raise UnsafeUrl("invalid_url", "Credentials in the URL are not allowed; use the signing secret.")
    host = parts.hostname or ""
    if not host:
        raise UnsafeUrl("invalid_url", "URL has no host.")
    literal = _literal_ip(host)
    if literal is not None:
        check_address(literal, policy)
    else:
        try:
            validators.validate_hostname(host, allow_wildcard=False)
        except validators.InvalidValue:
            raise UnsafeUrl("invalid_url_host", f"{host!r} is not a host name DNS can resolve: labels of letters, "
                            "digits and inner hyphens (at most 63 each), separated by single dots; write an "
                            "international name in its xn-- form.") from None
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    default_port = 443 if parts.scheme == "https" else 80
    return Target(scheme=parts.scheme, host=host, port=port or default_port, path=path)


def check_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address,
                  policy: AddressPolicy = PUBLIC_ONLY, *, name: str | None = None) -> None:
    """Raise UnsafeUrl unless `policy` lets a request go to `address`. With `name` (the host as typed), the
    message names the host, never the address it resolved to: how an internal name resolves is not the
    tenant's to learn from a delivery log."""
    mapped = getattr(address, "ipv4_mapped", None)
    if mapped is not None:
        address = mapped
    what = f"{name} resolves to" if name else f"{address} is"
    if address in _METADATA or address.is_link_local:
        raise UnsafeUrl("forbidden_address", f"{what} a link-local or cloud metadata address.")
    if address.is_multicast or address.is_unspecified or (address.is_reserved and not address.is_loopback):
        raise UnsafeUrl("forbidden_address", f"{name} does not resolve to a unicast host address." if name
                        else f"{address} is not a unicast host address.")
    if address.is_global or policy.allow_internal or any(address in net for net in policy.allow_networks):
        return
    raise UnsafeUrl("internal_address", f"{what} an internal address; this organization may only send to public "
                                        "addresses (and networks the operator allows).")


_RESOLVER = ThreadPoolExecutor(max_workers=8, thread_name_prefix="webhook-dns")


def resolve(target: Target, policy: AddressPolicy = PUBLIC_ONLY, timeout_s: float = 5.0) -> str:
    """The first address of the host, after checking every address it resolves to.

    The lookup runs on a small pool so a slow DNS server costs the attempt at most `timeout_s` (getaddrinfo
    itself cannot be interrupted; an abandoned lookup ends on its own in the pool)."""
    literal = _literal_ip(target.host)
    if literal is not None:
        check_address(literal, policy)
        return str(literal)
    lookup = _RESOLVER.submit(socket.getaddrinfo, target.host, target.port, type=socket.SOCK_STREAM)
    try:
        infos = lookup.result(timeout=timeout_s)
    except FuturesTimeout:
        raise outbound.DeadlineExceeded(f"looking up {target.host} took longer than {timeout_s:g} s") from None
    except (OSError, UnicodeError) as exc:
        raise UnsafeUrl("unresolvable_host", f"{target.host} does not resolve: {exc}.") from None
    addresses = [ipaddress.ip_address(info[4][0].split("%")[0]) for info in infos]
    if not addresses:
        raise UnsafeUrl("unresolvable_host", f"{target.host} does not resolve.")
    for address in addresses:
        check_address(address, policy, name=target.host)  # one bad address rejects the host: rebinding picks any
    return str(addresses[0])


def request(method: str, url: str, *, body: bytes | None = None, headers: dict[str, str] | None = None,
            timeout_s: float = 5.0, policy: AddressPolicy = PUBLIC_ONLY) -> Response:
    """One HTTP request to a checked address; no redirects; `timeout_s` bounds the whole attempt.
    Raises UnsafeUrl, or OSError (outbound.DeadlineExceeded when the deadline cut it)."""
    target = parse_url(url, policy)
    timeout_s = max(0.1, min(float(timeout_s), MAX_TIMEOUT_S))
    started = time.monotonic()
    with outbound.deadline(timeout_s, f"the request to {target.host}") as scope:
        address = resolve(target, policy, timeout_s=timeout_s)
        conn = _connection(target, address, outbound.per_read_timeout(timeout_s))
        try:
            send_headers = {"Host": _host_header(target), "User-Agent": USER_AGENT, "Connection": "close"}
            send_headers.update(headers or {})
            conn.request(method, target.path, body=body, headers=send_headers)
            reply = conn.getresponse()
            data = reply.read(MAX_RESPONSE_BYTES)
        except (http.client.HTTPException, ValueError) as exc:
            if scope.expired:
                raise  # the deadline turns it into DeadlineExceeded
            raise ConnectionError(f"the receiver broke the HTTP exchange: {type(exc).__name__}: {exc}") from exc
        finally:
            conn.close()
        if scope.expired:  # a cut read can look like a short, complete answer
            raise outbound.DeadlineExceeded(f"the request to {target.host} did not finish within {timeout_s:g} s")
    return Response(status=reply.status, body=data, elapsed_ms=(time.monotonic() - started) * 1000,
                    address=address)


def sign(secret: str, timestamp: int, body: bytes) -> str:
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"sha256={mac.hexdigest()}"


def verify(secret: str, timestamp: int, body: bytes, signature: str, *, now: float | None = None,
           tolerance_s: int = 300) -> bool:
    """What a receiver does; here for the tests and as the reference implementation."""
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_s:
        return False
    return hmac.compare_digest(sign(secret, timestamp, body), signature)


def deliver(url: str, *, secret: str, event: str, payload: dict[str, Any], timeout_s: float = 5.0,
            now: float | None = None, policy: AddressPolicy = PUBLIC_ONLY, delivery_id: str | None = None) -> Response:
    """POST a signed JSON payload. Raises UnsafeUrl or OSError; the caller decides on retries."""
    body = json.dumps(payload, sort_keys=True, separators=(",", ":"), default=str).encode()
    timestamp = int(time.time() if now is None else now)
    headers = {
        "Content-Type": "application/json",
        "X-Spillway-Event": event,
        "X-Spillway-Delivery": delivery_id or str(uuid.uuid4()),  # stable across retries when given
        TIMESTAMP_HEADER: str(timestamp),
        SIGNATURE_HEADER: sign(secret, timestamp, body),
    }
    return request("POST", url, body=body, headers=headers, timeout_s=timeout_s, policy=policy)


def _literal_ip(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _host_header(target: Target) -> str:
    host = f"[{target.host}]" if ":" in target.host else target.host
    default = 443 if target.scheme == "https" else 80
    return host if target.port == default else f"{host}:{target.port}"


def _connection(target: Target, address: str, timeout_s: float) -> http.client.HTTPConnection:
    if target.scheme == "http":
        return outbound.HTTPConnection(address, target.port, timeout=timeout_s)
    return outbound.HTTPSConnection(target.host, address, target.port, timeout_s)
