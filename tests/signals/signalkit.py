"""Helpers of the signals tests: member servers that answer slowly or with an error, and signal buckets written as
the collector writes them."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from apps.signals import hist, services
from apps.signals.aggregate import ALL_NODES
from apps.signals.models import SignalBucket


class _Handler(BaseHTTPRequestHandler):
    status = 200
    delay_s = 0.0

    def do_GET(self) -> None:
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.in_flight += 1  # type: ignore[attr-defined]
        time.sleep(self.server.delay_s)  # type: ignore[attr-defined]
        with self.server.lock:  # type: ignore[attr-defined]
            self.server.in_flight -= 1  # type: ignore[attr-defined]
        body = self.server.name.encode()  # type: ignore[attr-defined]
        self.send_response(self.server.status)  # type: ignore[attr-defined]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def slow_backend(name: str, status: int = 200, delay_s: float = 0.0) -> ThreadingHTTPServer:
    """An HTTP server on 127.0.0.1 answering `status` with its name after `delay_s`, counting `in_flight`
    requests (haproxykit's tiny_backend answers 200 at once and counts hits)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    server.name, server.status, server.delay_s = name, status, delay_s  # type: ignore[attr-defined]
    server.in_flight, server.lock = 0, threading.Lock()  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


def address_of(server: ThreadingHTTPServer) -> tuple[str, int]:
    return server.server_address[0], server.server_address[1]  # type: ignore[return-value]


def signal_bucket(kind: str, ref_id: int, *, org, lb_id: int, requests: int, s5xx: int = 0, node: str = "",
                  pool_id: int | None = None, ago_s: int = 20, upstream_ms: int = 10, region: str = "") -> SignalBucket:
    start = datetime.fromtimestamp((int(time.time()) - ago_s) // 5 * 5, UTC)
    counts = hist.new()
    counts[hist.index(upstream_ms)] = requests
    # As the collector writes them: a listener's or member's node row and its all-nodes row.
    for each in ((node, ALL_NODES) if node else ("",)):
        row = SignalBucket.objects.create(
            kind=kind, ref_id=ref_id, node=each, start=start, step_s=services.FINE_STEP_S, org=org, lb_id=lb_id,
            pool_id=pool_id, requests=requests, s2xx=requests - s5xx, s5xx=s5xx,
            region=region if each != ALL_NODES else "", t_upstream=hist.sparse(counts), t_total=hist.sparse(counts))
    return row
