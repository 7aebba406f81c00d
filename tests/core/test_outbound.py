"""Every outbound call has a deadline for the whole attempt, and no module opens connections around it.

A peer that trickles (one byte every 0.2 s, forever) defeats a per-read socket timeout. Each outbound path
Spillway has — webhooks tenants type, the ACME client, single sign-on — is pointed at such a peer and must
give up within its deadline. The scan at the end fails on any module that opens network connections and
is not listed here with the reason it may.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from apps.core import outbound, webhooks
from tests.netutil import Trickle
from tests.source import absolute_imports

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def trickle() -> Iterator[Trickle]:
    server = Trickle()
    yield server
    server.close()


def _timed(fn) -> tuple[float, BaseException | None]:
    started = time.monotonic()
    try:
        fn()
    except BaseException as exc:
        return time.monotonic() - started, exc
    return time.monotonic() - started, None


def test_a_webhook_to_a_trickling_receiver_ends_at_its_deadline(trickle):
    elapsed, error = _timed(lambda: webhooks.request("POST", f"{trickle.url}/hook", body=b"{}", timeout_s=1.0,
                                                     policy=webhooks.INTERNAL_TOO))
    assert isinstance(error, outbound.DeadlineExceeded), error
    assert 0.9 < elapsed < 1.8, elapsed


def test_requests_under_a_deadline_are_cut_however_the_peer_trickles(trickle):
    def call() -> None:
        with outbound.deadline(1.0):
            requests.get(trickle.url, timeout=5)

    elapsed, error = _timed(call)
    assert isinstance(error, outbound.DeadlineExceeded), error
    assert 0.9 < elapsed < 1.8, elapsed


def test_without_the_deadline_the_same_call_would_have_run_on(trickle):
    """The peer really trickles: a 3 s per-read timeout alone does not stop it within 2.5 s."""
    result: dict[str, object] = {}

    def call() -> None:
        try:
            with outbound.deadline(30.0):
                requests.get(trickle.url, timeout=3)
        except BaseException as exc:
            result["error"] = exc

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(2.5)
    assert thread.is_alive(), result
    trickle.close()
    thread.join(5)


def test_single_sign_on_discovery_gives_up_at_its_deadline(trickle, settings):
    from apps.accounts import sso

    settings.SSO_ISSUER, settings.SSO_TIMEOUT_S = trickle.url, 1.0
    sso._discovered.clear()
    elapsed, error = _timed(sso.discovery)
    assert isinstance(error, sso.SsoUnavailable), error
    assert elapsed < 1.8, elapsed


def test_the_acme_client_gives_up_at_its_deadline(trickle):
    from apps.acme import client

    elapsed, error = _timed(lambda: client.begin(
        directory_url=f"{trickle.url}/dir", account_key_pem=client.new_private_key_pem(), account_uri="",
        hostnames=["a.example"], kind="http-01", timeout_s=1.0))
    assert isinstance(error, client.AcmeFailure) and error.code == "ca_unreachable", error
    assert elapsed < 1.8, elapsed


def test_a_webhook_connection_outside_a_deadline_is_refused_under_the_suite(trickle):
    conn = outbound.HTTPConnection("127.0.0.1", trickle.port, timeout=1)
    with pytest.raises(outbound.OutboundWithoutDeadline):
        conn.connect()
    conn.close()


@pytest.mark.parametrize("url", ["https://a..x/", f"https://{'a' * 64}.example/", "https://exa\u2028mple.com/",
                                 "https://./", "https://-bad.example/", "https://b\u00fccher.example/"])
def test_a_webhook_url_whose_host_dns_cannot_carry_is_refused_when_saved(url):
    with pytest.raises(webhooks.UnsafeUrl) as refused:
        webhooks.parse_url(url)
    assert refused.value.code in ("invalid_url_host", "invalid_url")


# Modules that may open network connections themselves, and why.
ALLOWED = {
    "apps/core/outbound.py": "the deadline-watched connections everything else uses",
    "apps/core/webhooks.py": "tenant URLs, through apps.core.outbound under one deadline per attempt",
    "apps/accounts/sso.py": "the IdP, through requests (watched by apps.core.outbound) under a deadline",
    "apps/acme/deploy.py": "the operator's own nodes (HTTP-01 answers check), bounded by its timeout",
    "apps/fleets/node/transports/local.py": "the operator's own nodes on this host (sockets and probes)",
    "apps/fleets/node/transports/ssh.py": "the operator's own nodes over SSH (asyncssh, with its timeouts)",
    "apps/fleets/node/transports/__init__.py": "re-exports of the transports",
    "apps/fleets/node/runtime_api.py": "the HAProxy runtime API of the operator's nodes",
    "apps/fleets/config/check.py": "bind checks on this host before a push",
    "apps/fleets/api/serializers.py": "address parsing only (socket.inet_pton)",
    "apps/signals/collector.py": "receives the nodes' request log (a UDP socket it binds; it connects nowhere)",
    "apps/capacity/engine/driver.py": "the load generator itself (bounded by the run's plan)",
    "apps/capacity/engine/connection.py": "the load generator itself (bounded by the run's plan)",
    "apps/capacity/safety.py": "resolving a test target to check it (no connection)",
    "apps/core/ports.py": "checking that this host's ports are free",
}
NETWORK_MODULES = {"socket", "http.client", "requests", "urllib3", "urllib.request", "asyncssh", "aiohttp",
                   "httpx"}


def test_no_module_opens_connections_around_the_deadlines():
    found = {}
    for root in ("apps", "controlplane", "frontend"):
        for path in (REPO / root).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            for module, _names in absolute_imports(path):
                if module in NETWORK_MODULES or module.split(".")[0] in {"requests", "urllib3", "asyncssh", "httpx"}:
                    found.setdefault(str(path.relative_to(REPO)), []).append(module)
    unexplained = {p: m for p, m in found.items() if p not in ALLOWED}
    assert not unexplained, (f"these modules open network connections: route them through apps.core.outbound "
                             f"(or list them in ALLOWED with why they may): {unexplained}")
