"""One keep-alive HTTP/1.1 client connection, callback-driven (no coroutine per request).

The connection owns the prebuilt request bytes and a reusable httptools parser; sending is one
`transport.write`. It reports back to its driver through three calls, so the open- and closed-loop
drivers share it. One request in flight at a time (no pipelining), like a browser or wrk.
"""

from __future__ import annotations

import asyncio
import socket
from typing import TYPE_CHECKING, Protocol

import httptools

from .results import BAD_RESPONSE, OTHER, REFUSED, RESET, TIMEOUT

if TYPE_CHECKING:
    from .stats import StepStats


class ConnectionOwner(Protocol):
    def on_response(self, conn: HttpConnection, status: int, keep_alive: bool) -> None: ...

    def on_failure(self, conn: HttpConnection, kind: str) -> None: ...

    def on_lost(self, conn: HttpConnection, exc: Exception | None) -> None: ...


class HttpConnection(asyncio.Protocol):
    __slots__ = ("closed", "complete", "got_bytes", "keep_alive", "owner", "parser", "request", "retired",
                 "start_t", "stats", "transport")

    def __init__(self, owner: ConnectionOwner, request: bytes) -> None:
        self.owner = owner
        self.request = request
        self.transport: asyncio.Transport | None = None
        self.parser = httptools.HttpResponseParser(self)
        # Non-None exactly while a request is in flight: the step that request belongs to.
        self.stats: StepStats | None = None
        self.start_t = 0.0
        self.complete = False
        self.keep_alive = False
        self.got_bytes = False
        self.closed = False
        # Closed loop: the user behind this connection has left, so do not replace it.
        self.retired = False

    # --- driver side ---------------------------------------------------------------------------

    def send(self, start_t: float, stats: StepStats) -> None:
        """Send the request; latency will be measured from `start_t` (perf_counter seconds)."""
        self.start_t = start_t
        self.stats = stats
        self.got_bytes = False
        self.transport.write(self.request)  # type: ignore[union-attr]

    def close(self) -> None:
        """Drop the connection at once (RST), e.g. after a timeout: it cannot be reused anyway."""
        if not self.closed and self.transport is not None:
            self.closed = True
            self.transport.abort()

    # --- asyncio side --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        sock = transport.get_extra_info("socket")
        if sock is not None:
            # Requests are tiny; Nagle would hold the second one back on a keep-alive connection.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.got_bytes = True
        try:
            self.parser.feed_data(data)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            self.owner.on_failure(self, BAD_RESPONSE)
            return
        if self.complete:
            # Handled here rather than inside the parser callback: an exception raised from a
            # callback would surface as a parser error and be misfiled as a bad response.
            self.complete = False
            self.owner.on_response(self, self.parser.get_status_code(), self.keep_alive)

    def on_message_complete(self) -> None:
        # llhttp resets its connection flags once the message is done: ask while still inside it.
        self.keep_alive = self.parser.should_keep_alive()
        self.complete = True

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.owner.on_lost(self, exc)


def classify_connect_error(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return REFUSED
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return RESET
    if isinstance(exc, TimeoutError):
        return TIMEOUT
    return OTHER


def classify_lost(conn: HttpConnection, exc: Exception | None) -> str:
    """Why a connection with a request in flight ended without a complete response."""
    if exc is None:
        # The server closed cleanly: with part of a response that is a truncated (bad) response,
        # with nothing it is the server dropping the request, which a user sees as a reset.
        return BAD_RESPONSE if conn.got_bytes else RESET
    return classify_connect_error(exc)
