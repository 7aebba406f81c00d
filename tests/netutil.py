"""Loopback port helpers, and a peer that trickles its answer (`Trickle`), shared by tests and benchmarks (no Django,
no pytest)."""

from __future__ import annotations

import http.client
import secrets
import socket
import threading
import time

# Picked ports lie below the kernel's ephemeral range: a port the kernel chose there and this helper let go could be
# handed to any process's outgoing connection before the test bound it again (a suite run saw HAProxy refuse its
# frontend, "Address already in use", that way). Below the range only another pick can take it, ~1 in 12,000.
_BELOW_EPHEMERAL = 12_000


def _ephemeral_low() -> int:
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as ports:
            return int(ports.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def pick_free_port(address: str = "127.0.0.1") -> int:
    """A port free on ``address`` right now, outside the range the kernel gives outgoing connections (random, so
    parallel runs don't collide; the kernel's choice where none is free there)."""
    high = _ephemeral_low()
    low = max(1024, high - _BELOW_EPHEMERAL)
    for _ in range(100):
        port = low + secrets.randbelow(high - low)
        with socket.socket() as sock:
            try:
                sock.bind((address, port))
            except OSError:
                continue
            return port
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def free_udp_port() -> int:
    """A UDP port free on 127.0.0.1 right now (a signals collector's)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_on(addresses: list[str], attempts: int = 100) -> int:
    """A port free on every address (picked on the first, the others are checked)."""
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


class Trickle:
    """A TCP server on loopback that reads the request, then sends an HTTP header byte every `every_s`."""

    def __init__(self, every_s: float = 0.2, limit_s: float = 60.0) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)  # here, not in the thread: a test may close the socket before that thread runs
        self.port = self.sock.getsockname()[1]
        self.every_s, self.limit_s = every_s, limit_s
        self.stop = threading.Event()
        threading.Thread(target=self._serve, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:  # closed
                return
            threading.Thread(target=self._drip, args=(conn,), daemon=True).start()

    def _drip(self, conn: socket.socket) -> None:
        started = time.monotonic()
        with conn:
            try:
                conn.settimeout(1.0)
                conn.recv(65536)
                payload = b"HTTP/1.1 200 OK\r\n" + b"X-Slow: " + b"a" * 100_000
                for byte in payload:
                    if self.stop.is_set() or time.monotonic() - started > self.limit_s:
                        return
                    conn.sendall(bytes([byte]))
                    time.sleep(self.every_s)
            except OSError:
                return

    def close(self) -> None:
        self.stop.set()
        self.sock.close()
