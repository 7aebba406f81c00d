"""Tiny HTTP backends for the demo fleet: `python -m apps.fleets.demobackend NAME=ADDR:PORT ...`.

Each listener answers 200 with a line naming itself, so curl through the demo fleet shows which
region and member served the request. Loopback only; one process, one thread per connection.
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from apps.core.shutdown import stop_on_signals


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    label = ""


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def do_GET(self) -> None:
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
        address, _, port = endpoint.rpartition(":")
        if not address.startswith("127."):
            raise SystemExit(f"demo backends listen on loopback only, not {address}")
        server = _Server((address, int(port)), _Handler)
        server.label = label
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
        servers.append(server)
    stop = stop_on_signals()
    print(f"demo backends listening: {' '.join(argv)}", flush=True)
    while not stop.wait(0.2):  # a timed wait lets the signal handler run in this thread
        pass
    for server in servers:
        server.shutdown()
        server.server_close()


if __name__ == "__main__":
    main(sys.argv[1:])
