"""Two local nodes with a health port behind a real upstream HAProxy that checks them (`pair`, `healthy_pair`,
`upstream`: fixtures of the whole suite, tests/conftest.py `pytest_plugins`), and reading what the upstream saw.
The drain tests use them through the API (tests/fleets/test_node_drain.py) and in a browser
(tests/frontend/test_node_drain_browser.py)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from apps.fleets.models import Node
from apps.fleets.node.runtime_api import HAProxySocket, MasterSocket, RuntimeUnavailable
from apps.fleets.node.showstat import parse_show_stat
from tests.fleets.fleetkit import LocalFleet, reconcile, serving_local_fleet
from tests.netutil import free_port_on
from tests.processes import stop_process

UPSTREAM = "127.0.79.1"


def status_of(url: str, timeout: float = 10.0) -> int:
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
                if all(s == "UP" for s in upstream_statuses(sock).values()):
                    break
            except (OSError, RuntimeUnavailable):
                pass
            assert time.monotonic() < deadline, "the upstream never saw both nodes up"
            time.sleep(0.1)
        yield f"http://{UPSTREAM}:{port}", sock
    finally:
        stop_process(proc)


def upstream_statuses(sock: HAProxySocket) -> dict[str, str]:
    return {r.svname: r.status for r in parse_show_stat(sock.command("show stat")) if r.pxname == "nodes"
            and r.svname not in ("FRONTEND", "BACKEND")}


def upstream_served(sock: HAProxySocket) -> dict[str, int]:
    return {r.svname: int(r.raw.get("stot") or 0) for r in parse_show_stat(sock.command("show stat"))
            if r.pxname == "nodes" and r.svname not in ("FRONTEND", "BACKEND")}


def node_workers(local: LocalFleet) -> dict[str, int]:
    return {n.name: MasterSocket(f"{n.runtime_dir}/master.sock").show_proc().current_worker.pid for n in local.nodes}
