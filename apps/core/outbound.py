"""Every outbound call to a peer Spillway does not run has a deadline for the whole attempt.

A socket timeout bounds one read, not an attempt: a receiver that sends one header line a second kept a
webhook delivery "sending" for 33 s with a 3 s timeout. Here an attempt runs inside `deadline(seconds)`;
every socket it opens is watched, and when the deadline passes a watchdog thread shuts the socket down,
which wakes the blocked read at once. The attempt then fails with DeadlineExceeded (a TimeoutError, so
callers that retry on OSError keep doing so), however the peer trickles.

Two kinds of connection are watched:
- `HTTPConnection` / `HTTPSConnection` below (http.client), used by apps.core.webhooks for the URLs tenants
  type (job webhooks, event subscriptions, the http_check kind). The TLS handshake runs after the socket
  is watched, so a trickled handshake is cut too;
- every urllib3 connection (`install()`, from CoreConfig.ready): requests, and what is built on it (the ACME
  client, single sign-on). Their sockets are watched once connected.

A socket opened outside any `deadline(...)` gets OUTBOUND_DEFAULT_DEADLINE_S from its connect, so nothing
waits forever. Under the test suite a webhook connection outside a deadline is an error
(OutboundWithoutDeadline), so a new tenant-URL path without its own deadline fails the tests that reach it;
tests/core/test_outbound.py fails on any module that opens HTTP connections without going through here, and
cuts each outbound path (webhooks, ACME, single sign-on) with a peer that trickles forever.

Sockets are held as objects, never as file descriptor numbers: a socket closed before its deadline has no
descriptor left (fileno -1), so shutting it down later touches nothing, never a reused descriptor.
"""

from __future__ import annotations

import contextlib
import heapq
import http.client
import itertools
import logging
import socket
import ssl
import threading
import time
from typing import Any, Final

log = logging.getLogger(__name__)

DEFAULT_DEADLINE_S: Final = 30.0


class DeadlineExceeded(TimeoutError):
    """The whole attempt took longer than its deadline (the peer was cut off)."""


class OutboundWithoutDeadline(RuntimeError):
    """A connection was opened outside `deadline(...)` (a programming error the test suite refuses)."""


class _Watchdog:
    """One daemon thread for the process: shuts sockets down when their deadline passes."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Deadline]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    def arm(self, scope: Deadline) -> None:
        with self._cond:
            heapq.heappush(self._heap, (scope.at, next(self._seq), scope))
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="outbound-deadlines", daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._heap:
                    self._cond.wait()
                at, _, scope = self._heap[0]
                delay = at - time.monotonic()
                if delay > 0:
                    self._cond.wait(timeout=delay)
                    continue
                heapq.heappop(self._heap)
            scope._expire()


_WATCHDOG = _Watchdog()
_local = threading.local()


class Deadline:
    """A deadline for one outbound attempt; use as `with deadline(5.0) as d:` (d.remaining() for timeouts)."""

    def __init__(self, seconds: float, what: str = "the outbound call") -> None:
        self.seconds = max(0.001, float(seconds))
        self.at = time.monotonic() + self.seconds
        self.what = what
        self.expired = False
        self.closed = False
        self._sockets: list[socket.socket] = []
        self._lock = threading.Lock()
        self._armed = False

    def remaining(self) -> float:
        return max(0.0, self.at - time.monotonic())

    def watch(self, sock: Any) -> None:
        """Cut `sock` when the deadline passes (at once if it already has)."""
        with self._lock:
            if self.closed:
                return
            self._sockets.append(sock)
            expired = self.expired
            if not self._armed:
                self._armed = True
                _WATCHDOG.arm(self)
        if expired:
            _shutdown(sock)

    def _expire(self) -> None:
        with self._lock:
            if self.closed:
                return
            self.expired = True
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)

    def __enter__(self) -> Deadline:
        stack = getattr(_local, "stack", None)
        if stack is None:
            stack = _local.stack = []
        stack.append(self)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        _local.stack.remove(self)
        with self._lock:
            self.closed = True
            self._sockets.clear()
        if exc is not None and self.expired and not isinstance(exc, DeadlineExceeded):
            raise DeadlineExceeded(f"{self.what} did not finish within {self.seconds:g} s (the peer was cut off)"
                                   ) from exc
        return False


def deadline(seconds: float, what: str = "the outbound call") -> Deadline:
    return Deadline(seconds, what)


def current() -> Deadline | None:
    stack = getattr(_local, "stack", None)
    return stack[-1] if stack else None


def watch(sock: Any, *, strict: bool = False) -> None:
    """Put a freshly opened socket under the current deadline (or the default one, see the module doc)."""
    scope = current()
    if scope is None:
        from django.conf import settings

        if strict and getattr(settings, "TESTING", False):
            raise OutboundWithoutDeadline("an outbound connection was opened outside apps.core.outbound.deadline()")
        scope = Deadline(float(getattr(settings, "OUTBOUND_DEFAULT_DEADLINE_S", DEFAULT_DEADLINE_S)),
                         "an outbound call without its own deadline")
        log.warning("outbound connection without a deadline; cut after %.0f s", scope.seconds)
    scope.watch(sock)


def _shutdown(sock: Any) -> None:
    with contextlib.suppress(OSError):  # already closed (fileno -1) or not connected: nothing to cut
        sock.shutdown(socket.SHUT_RDWR)


def per_read_timeout(timeout_s: float) -> float:
    """A socket timeout that never outlasts the current deadline."""
    scope = current()
    return max(0.05, min(timeout_s, scope.remaining())) if scope is not None else timeout_s


# --- http.client connections (apps.core.webhooks) ------------------------------------------------------------


class HTTPConnection(http.client.HTTPConnection):
    """To a checked address, watched by the current deadline."""

    def connect(self) -> None:
        super().connect()
        watch(self.sock, strict=True)


class HTTPSConnection(http.client.HTTPSConnection):
    """TLS to a checked address with SNI and certificate checks for `host`; the handshake runs after the
    socket is watched, so a peer that trickles it is cut too."""

    def __init__(self, host: str, address: str, port: int, timeout_s: float,
                 context: ssl.SSLContext | None = None) -> None:
        super().__init__(host, port, timeout=timeout_s, context=context or ssl.create_default_context())
        self._address = address

    def connect(self) -> None:
        raw = socket.create_connection((self._address, self.port), self.timeout)
        watch(raw, strict=True)
        sock = self._context.wrap_socket(raw, server_hostname=self.host,  # type: ignore[attr-defined]
                                         do_handshake_on_connect=False)
        watch(sock)  # the raw object is detached now; this one carries the descriptor
        sock.do_handshake()
        self.sock = sock


# --- urllib3 (requests, the ACME client, single sign-on) ---------------------------------------------------


def install() -> None:
    """Watch every urllib3 connection's socket once it is connected (idempotent)."""
    try:
        import urllib3.connection
        import urllib3.connectionpool
    except ImportError:  # pragma: no cover - requests is a dependency
        return
    if getattr(urllib3.connection.HTTPConnection, "_spillway_watched", False):
        return
    for cls in (urllib3.connection.HTTPConnection, urllib3.connection.HTTPSConnection):  # neither calls the other
        original = cls.connect

        def connect(self, _original=original) -> None:
            _original(self)
            watch(self.sock)

        cls.connect = connect  # type: ignore[method-assign]
        cls._spillway_watched = True  # type: ignore[attr-defined]
