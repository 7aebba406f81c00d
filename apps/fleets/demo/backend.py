"""Tiny HTTP backends for the demo fleet: `PYTHONPATH=. python apps/fleets/demo/backend.py NAME=ADDR:PORT[@RATE] ...`.

Each listener answers 200 with a line naming itself, so curl through the demo fleet shows which
region and member served the request. Loopback only; one process, one thread per connection.

Each backend has a real, documented capacity (its knee): it serves one request at a time, each taking
1/RATE seconds (RATE defaults to DEMO_BACKEND_RATE, 60 req/s). Below RATE a request is answered in about
1/RATE s; above it requests queue and latency climbs without bound, as a saturated server's does. So the
demo's `edge-knee` capacity test (2 us-east members, steps 20 -> 160 req/s) finds its knee at the 80 req/s
step, under the 2 x 60 = 120 req/s the members can serve. Writes go out with TCP_NODELAY: with Nagle on,
every keep-alive request waited ~40 ms for the client's delayed ACK, which hid any knee behind a flat p50.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from apps.core.shutdown import stop_on_signals

DEFAULT_RATE = float(os.environ.get("DEMO_BACKEND_RATE", "60"))


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    label = ""
    service_s = 1.0 / DEFAULT_RATE
    busy: threading.Lock

    def handle_error(self, request, client_address) -> None:
        # A client (HAProxy's health check, an aborted test) closing mid-answer is normal here: no traceback
        # (they grew the log by 4.4 MB in 24 minutes). Anything else: one line.
        kind = sys.exc_info()[0]
        if kind is not None and issubclass(kind, ConnectionError | TimeoutError):
            return
        print(f"{self.label}: {kind.__name__ if kind else 'error'} from {client_address}", file=sys.stderr)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # TCP_NODELAY (see the module's doc)
    server: _Server

    def do_GET(self) -> None:
        with self.server.busy:  # one at a time, 1/RATE s each: the backend's capacity
            time.sleep(self.server.service_s)
        body = f"{self.server.label} {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main(argv: list[str]) -> None:
    servers = []
    for spec in argv:
        label, _, endpoint = spec.partition("=")
        endpoint, _, rate = endpoint.partition("@")
        address, _, port = endpoint.rpartition(":")
        if not address.startswith("127."):
            raise SystemExit(f"demo backends listen on loopback only, not {address}")
        server = _Server((address, int(port)), _Handler)
        server.label = label
        server.busy = threading.Lock()
        server.service_s = 1.0 / float(rate) if rate else 1.0 / DEFAULT_RATE
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        servers.append(server)
    stop = stop_on_signals()
    print(f"demo backends listening: {' '.join(argv)}", flush=True)
    while not stop.wait(0.2):  # a timed wait lets the signal handler run in this thread
        pass
    # Together: each shutdown waits up to a poll interval for its loop, and one after another that added up.
    stoppers = [threading.Thread(target=server.shutdown) for server in servers]
    for stopper in stoppers:
        stopper.start()
    for stopper, server in zip(stoppers, servers, strict=True):
        stopper.join()
        server.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
