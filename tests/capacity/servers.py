"""Real HTTP servers with known behaviour, for load-engine tests.

Each server runs in its own process (so it never competes with the engine for the GIL) on
127.0.0.1 and a free port chosen by the kernel; `ServerProcess` starts one, reads the port it
printed, and stops it by PID. Kinds:

- ok: answers 200 at once.
- capacity --rate N: one request at a time, each taking exactly 1/N s; beyond that requests queue
  (FIFO across all connections), so the server's capacity is N req/s and latency grows without bound
  above it, like the single-server example in Google's SRE capacity material.
- stall --stall-after-s A --stall-s S: answers at once, except that A s after the first request it
  holds every request for S s, once.
- status --code C: answers status C (e.g. 503).
- reset: resets the connection (RST) when a request arrives.
- blackhole: accepts and reads, never answers.
- garbage: answers bytes that are not HTTP.

Run directly: `python tests/capacity/servers.py capacity --rate 100` prints `PORT <n>`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import select
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path
from types import TracebackType

OK_RESPONSE = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nok"


def status_response(code: int) -> bytes:
    return f"HTTP/1.1 {code} Status\r\nContent-Type: text/plain\r\nContent-Length: 2\r\n\r\nno".encode()


class _Behaviour:
    """Decides when (and whether) a request gets its answer. `now` is loop.time()."""

    def __init__(self, args: argparse.Namespace, loop: asyncio.AbstractEventLoop) -> None:
        self.args = args
        self.loop = loop
        self.kind = args.kind
        self.next_free_t = 0.0
        self.first_request_t: float | None = None
        self.response = status_response(args.code) if args.kind == "status" else OK_RESPONSE

    def handle(self, proto: _ServerProtocol) -> None:
        now = self.loop.time()
        kind = self.kind
        if kind in ("ok", "status"):
            proto.write(self.response)
        elif kind == "capacity":
            # Virtual single worker: each request finishes 1/N s after the previous one did (or
            # after it arrived, if the worker was idle). Timing from a virtual clock keeps timer
            # jitter from accumulating, so capacity is exactly N.
            self.next_free_t = max(now, self.next_free_t) + 1.0 / self.args.rate
            self.loop.call_at(self.next_free_t, proto.write, OK_RESPONSE)
        elif kind == "stall":
            if self.first_request_t is None:
                self.first_request_t = now
            stall_start = self.first_request_t + self.args.stall_after_s
            stall_end = stall_start + self.args.stall_s
            if stall_start <= now < stall_end:
                self.loop.call_at(stall_end, proto.write, OK_RESPONSE)
            else:
                proto.write(OK_RESPONSE)
        elif kind == "reset":
            proto.reset()
        elif kind == "garbage":
            proto.write(b"THIS IS NOT HTTP\r\n\r\n")
        # blackhole: never answer


class _ServerProtocol(asyncio.Protocol):
    def __init__(self, behaviour: _Behaviour) -> None:
        self.behaviour = behaviour
        self.buffer = b""
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        # GET requests only: a request ends at the blank line.
        while b"\r\n\r\n" in self.buffer:
            _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            self.behaviour.handle(self)

    def write(self, data: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def reset(self) -> None:
        if self.transport is None:
            return
        sock = self.transport.get_extra_info("socket")
        # Linger 0 makes close() send RST instead of FIN.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.transport.abort()


async def _serve(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    behaviour = _Behaviour(args, loop)
    server = await loop.create_server(lambda: _ServerProtocol(behaviour), "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(f"PORT {port}", flush=True)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    kinds = ["ok", "capacity", "stall", "status", "reset", "blackhole", "garbage"]
    parser.add_argument("kind", choices=kinds)
    parser.add_argument("--rate", type=float, default=100.0, help="capacity: requests per second")
    parser.add_argument("--stall-after-s", type=float, default=1.0)
    parser.add_argument("--stall-s", type=float, default=1.0)
    parser.add_argument("--code", type=int, default=503)
    asyncio.run(_serve(parser.parse_args(argv)))


class ServerProcess:
    """A test server in a child process: `with ServerProcess("capacity", "--rate", "100") as srv:`."""

    def __init__(self, kind: str, *args: str, start_timeout_s: float = 10.0) -> None:
        self.cmd = [sys.executable, str(Path(__file__).resolve()), kind, *args]
        self.start_timeout_s = start_timeout_s
        self.proc: subprocess.Popen[str] | None = None
        self.port = 0

    def start(self) -> ServerProcess:
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, text=True)
        try:
            assert self.proc.stdout is not None
            ready, _, _ = select.select([self.proc.stdout], [], [], self.start_timeout_s)
            line = self.proc.stdout.readline() if ready else ""  # the child prints its port first
            if not line.startswith("PORT "):
                raise RuntimeError(f"test server {self.cmd} did not start: {line!r}")
            self.port = int(line.split()[1])
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()

    def __enter__(self) -> ServerProcess:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def closed_port() -> int:
    """A loopback port nothing listens on (free a moment ago; nothing here binds ports at random)."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


if __name__ == "__main__":
    main()
