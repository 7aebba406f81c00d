"""A drained node fails the health check a real upstream load balancer uses, and its open requests finish.

GIVEN two local nodes with a health port, behind a real upstream HAProxy that checks
`GET /spillway/healthz` on that port, WHEN an operator drains n1 through the API, THEN n1's endpoint answers
503 with no reload, the upstream takes n1 out within a second or two and sends every new request to n2, a
request already running on n1 finishes with a 200, and undraining brings n1 back.
"""

from __future__ import annotations

import threading
import time

import pytest

from tests.fleets.drainkit import node_workers, status_of, upstream_served, upstream_statuses

from .fleetkit import reconcile

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]

def test_a_drained_node_fails_the_upstreams_check_and_its_open_request_finishes(
        healthy_pair, otto, upstream, django_capture_on_commit_callbacks):
    local = healthy_pair
    url, sock = upstream
    n1, n2 = sorted(local.nodes, key=lambda n: n.name)
    health = {n.name: f"http://{n.bind_address}:{n.health_port}/spillway/healthz" for n in (n1, n2)}
    assert {name: status_of(u) for name, u in health.items()} == {"n1": 200, "n2": 200}
    for _ in range(10):
        assert status_of(f"{url}/warm") == 200
    assert all(count > 0 for count in upstream_served(sock).values())
    workers = node_workers(local)

    # A request already on n1 when the drain starts (3 s at the backend).
    slow: dict[str, int] = {}
    thread = threading.Thread(target=lambda: slow.update(
        status=status_of(f"http://{n1.bind_address}:{local.port}/slow/3000", timeout=20)))
    thread.start()
    time.sleep(0.3)

    with django_capture_on_commit_callbacks(execute=True):  # the node's refresh rollout is queued on commit
        answer = otto.client.patch(f"/api/v1/nodes/{n1.pk}/", {"drained": True}, format="json")
    assert answer.status_code == 200, answer.content
    reconcile(local.fleet)  # what the reconcile task runs
    assert {name: status_of(u) for name, u in health.items()} == {"n1": 503, "n2": 200}
    assert node_workers(local) == workers, "draining reloaded a node"
    deadline = time.monotonic() + 3
    while upstream_statuses(sock)["n1"] != "DOWN":
        assert time.monotonic() < deadline, upstream_statuses(sock)
        time.sleep(0.05)
    before = upstream_served(sock)
    for _ in range(20):
        assert status_of(f"{url}/after") == 200
    after = upstream_served(sock)
    assert (after["n1"] - before["n1"], after["n2"] - before["n2"]) == (0, 20)
    thread.join(20)
    assert slow == {"status": 200}, "the request open on the drained node did not finish"

    with django_capture_on_commit_callbacks(execute=True):
        assert otto.client.patch(f"/api/v1/nodes/{n1.pk}/", {"drained": False}, format="json").status_code == 200
    reconcile(local.fleet)
    assert status_of(health["n1"]) == 200
    deadline = time.monotonic() + 3
    while upstream_statuses(sock)["n1"] != "UP":
        assert time.monotonic() < deadline, upstream_statuses(sock)
        time.sleep(0.05)
    assert node_workers(local) == workers
