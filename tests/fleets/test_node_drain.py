"""A drained node fails the health check a real upstream load balancer uses, and its open requests finish.

GIVEN two local nodes with a health port, behind a real upstream HAProxy that checks
`GET /spillway/healthz` on that port, WHEN an operator drains n1 through the API, THEN n1's endpoint answers
503 with no reload, the upstream takes n1 out within a second or two and sends every new request to n2, a
request already running on n1 finishes with a 200, and undraining brings n1 back.
"""

from __future__ import annotations

import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest

from apps.fleets.models import Node
from apps.fleets.node.runtime_api import HAProxySocket, MasterSocket, RuntimeUnavailable
from apps.fleets.node.showstat import parse_show_stat
from tests.netutil import free_port_on
from tests.processes import stop_process

from .fleetkit import LocalFleet, reconcile, serving_local_fleet

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]

UPSTREAM = "127.0.79.1"


def _get(url: str, timeout: float = 10.0) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as reply:  # noqa: S310 (loopback, our own)
            return reply.status
    except urllib.error.HTTPError as exc:
        return exc.code


@pytest.fixture
def pair(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("app"), name="drn", subnet=78, node_count=2) as local:
        yield local


@pytest.fixture
def healthy_pair(pair) -> LocalFleet:
    port = free_port_on([n.bind_address for n in pair.nodes])
    Node.objects.filter(fleet=pair.fleet).update(health_port=port)
    reconcile(pair.fleet)
    return pair


@pytest.fixture
def upstream(haproxy_bin, healthy_pair, tmp_path) -> Iterator[tuple[str, HAProxySocket]]:
    """A plain HAProxy in front of both nodes, checking their health endpoints every 200 ms."""
    pair = healthy_pair
    nodes = list(pair.nodes)
    port = free_port_on([UPSTREAM])
    health = nodes[0].health_port
    servers = "\n".join(f"    server {n.name} {n.bind_address}:{pair.port} check port {health}" for n in nodes)
    (tmp_path / "up.cfg").write_text(f"""global
    stats socket {tmp_path}/up.sock mode 600 level admin
defaults
    mode http
    timeout connect 2s
    timeout client 20s
    timeout server 20s
frontend up
    bind {UPSTREAM}:{port}
    default_backend nodes
backend nodes
    balance roundrobin
    option httpchk GET /spillway/healthz
    default-server inter 200ms fall 1 rise 1
{servers}
""")
    proc = subprocess.Popen([haproxy_bin, "-db", "-f", str(tmp_path / "up.cfg")], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        sock = HAProxySocket(str(tmp_path / "up.sock"))
        deadline = time.monotonic() + 10
        while True:
            try:
                if all(s == "UP" for s in _statuses(sock).values()):
                    break
            except (OSError, RuntimeUnavailable):
                pass
            assert time.monotonic() < deadline, "the upstream never saw both nodes up"
            time.sleep(0.1)
        yield f"http://{UPSTREAM}:{port}", sock
    finally:
        stop_process(proc)


def _statuses(sock: HAProxySocket) -> dict[str, str]:
    return {r.svname: r.status for r in parse_show_stat(sock.command("show stat")) if r.pxname == "nodes"
            and r.svname not in ("FRONTEND", "BACKEND")}


def _served(sock: HAProxySocket) -> dict[str, int]:
    return {r.svname: int(r.raw.get("stot") or 0) for r in parse_show_stat(sock.command("show stat"))
            if r.pxname == "nodes" and r.svname not in ("FRONTEND", "BACKEND")}


def _workers(local: LocalFleet) -> dict[str, int]:
    return {n.name: MasterSocket(f"{n.runtime_dir}/master.sock").show_proc().current_worker.pid for n in local.nodes}


def test_a_drained_node_fails_the_upstreams_check_and_its_open_request_finishes(
        healthy_pair, otto, upstream, django_capture_on_commit_callbacks):
    local = healthy_pair
    url, sock = upstream
    n1, n2 = sorted(local.nodes, key=lambda n: n.name)
    health = {n.name: f"http://{n.bind_address}:{n.health_port}/spillway/healthz" for n in (n1, n2)}
    assert {name: _get(u) for name, u in health.items()} == {"n1": 200, "n2": 200}
    for _ in range(10):
        assert _get(f"{url}/warm") == 200
    assert all(count > 0 for count in _served(sock).values())
    workers = _workers(local)

    # A request already on n1 when the drain starts (3 s at the backend).
    slow: dict[str, int] = {}
    thread = threading.Thread(target=lambda: slow.update(
        status=_get(f"http://{n1.bind_address}:{local.port}/slow/3000", timeout=20)))
    thread.start()
    time.sleep(0.3)

    with django_capture_on_commit_callbacks(execute=True):  # the node's refresh rollout is queued on commit
        answer = otto.client.patch(f"/api/v1/nodes/{n1.pk}/", {"drained": True}, format="json")
    assert answer.status_code == 200, answer.content
    reconcile(local.fleet)  # what the reconcile task runs
    assert {name: _get(u) for name, u in health.items()} == {"n1": 503, "n2": 200}
    assert _workers(local) == workers, "draining reloaded a node"
    deadline = time.monotonic() + 3
    while _statuses(sock)["n1"] != "DOWN":
        assert time.monotonic() < deadline, _statuses(sock)
        time.sleep(0.05)
    before = _served(sock)
    for _ in range(20):
        assert _get(f"{url}/after") == 200
    after = _served(sock)
    assert (after["n1"] - before["n1"], after["n2"] - before["n2"]) == (0, 20)
    thread.join(20)
    assert slow == {"status": 200}, "the request open on the drained node did not finish"

    with django_capture_on_commit_callbacks(execute=True):
        assert otto.client.patch(f"/api/v1/nodes/{n1.pk}/", {"drained": False}, format="json").status_code == 200
    reconcile(local.fleet)
    assert _get(health["n1"]) == 200
    deadline = time.monotonic() + 3
    while _statuses(sock)["n1"] != "UP":
        assert time.monotonic() < deadline, _statuses(sock)
        time.sleep(0.05)
    assert _workers(local) == workers
