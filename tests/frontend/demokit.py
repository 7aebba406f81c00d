"""The demo fleet on addresses of its own for the browser journeys (tests/frontend/conftest.py's `demo_fleet`
starts it), and reading a page through one of its nodes."""

from __future__ import annotations

from tests.netutil import http_get

# The demo fleet's layout on addresses of its own, so neither `make run` nor another test's demo
# fleet on this machine is in the way (the listener port stays the demo's 8080).
NODES = {"us-east": ["127.0.46.1", "127.0.46.2"], "eu-west": ["127.0.47.1", "127.0.47.2"]}
BACKENDS = {
    ("acme", "us-east"): [("127.0.26.1", 9101), ("127.0.26.2", 9101)],
    ("acme", "eu-west"): [("127.0.27.1", 9101)],
    ("globex", "us-east"): [("127.0.26.1", 9201)],
    ("globex", "eu-west"): [("127.0.27.1", 9201)],
}
ROLLOUT_TIMEOUT_MS = 90_000


def through_node(address: str, path: str, host: str) -> tuple[int, str]:
    try:
        return http_get(f"http://{address}:8080{path}", headers={"Host": host})
    except OSError as exc:
        return 0, str(exc)
