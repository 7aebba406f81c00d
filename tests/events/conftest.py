"""A local webhook receiver on a kernel-chosen loopback port: records every request, answers from a script."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


@dataclass
class Received:
    headers: dict[str, str]
    raw: bytes

    @property
    def json(self) -> dict:
        return json.loads(self.raw)


@dataclass
class Receiver:
    url: str
    requests: list[Received] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)  # answered in order; 200 once exhausted
    arrived: threading.Event = field(default_factory=threading.Event)


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    box: dict[str, Receiver] = {}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            rec = box["r"]
            raw = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            rec.requests.append(Received({k.lower(): v for k, v in self.headers.items()}, raw))
            status = rec.statuses.pop(0) if rec.statuses else 200
            self.send_response(status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")
            rec.arrived.set()

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    box["r"] = Receiver(url=f"http://127.0.0.1:{server.server_address[1]}/hook")
    # shutdown() waits for the loop's next poll: 0.5 s by default, at every test's teardown
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield box["r"]
    server.shutdown()
    server.server_close()


@pytest.fixture
def loopback_allowed(settings):
    # Tenants may only reach public addresses unless the deployment lists a network; the receiver is on loopback.
    settings.SCHEDULING_TENANT_URL_ALLOW_CIDRS = ["127.0.0.0/8"]
