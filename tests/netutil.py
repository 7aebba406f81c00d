"""Loopback port helpers shared by tests and benchmarks (no Django, no pytest)."""

from __future__ import annotations

import http.client
import socket


def pick_free_port(address: str = "127.0.0.1") -> int:
    """A port free on ``address`` right now (the kernel's choice, so parallel runs don't collide)."""
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 right now (a signals collector's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_on(addresses: list[str], attempts: int = 100) -> int:
    """A port free on every address (the kernel picks it on the first, the others are checked)."""
    for _ in range(attempts):
        port = pick_free_port(addresses[0])
        ok = True
        for address in addresses[1:]:
            with socket.socket() as probe:
                try:
                    probe.bind((address, port))
                except OSError:
                    ok = False
        if ok:
            return port
    raise RuntimeError(f"no port free on all of {addresses}")


def http_get(url: str, timeout_s: float = 2.0, headers: dict[str, str] | None = None) -> tuple[int, str]:
    """(status, body) of one GET with a fresh connection (no keep-alive between calls)."""
    rest = url.split("://", 1)[1]
    hostport, _, path = rest.partition("/")
    host, _, port = hostport.partition(":")
    conn = http.client.HTTPConnection(host, int(port or 80), timeout=timeout_s)
    try:
        conn.request("GET", "/" + path, headers={"Connection": "close", **(headers or {})})
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()
