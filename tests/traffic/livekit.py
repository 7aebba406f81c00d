"""A fleet of real HAProxy nodes over acme's two-region pool (`start`: 2 x 2 by default, one node per region for the
overflow tests), paced load and sticky-session clients through them, the enforcement loop run in a thread, and what
each node served: shared by the live traffic and capacity-drill tests (and bench-steering's clients)."""

from __future__ import annotations

import http.client
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field

from apps.balancers.models import Listener, Member, Pool, PoolRegion
from apps.capacity.engine import LoadPlan, RunResult, Target, run_plan
from apps.fleets import selectors as fleet_selectors
from apps.fleets.config.render import render
from apps.fleets.config.render.chain import LIMITS_MAP
from apps.fleets.config.spec import ConfigBundle, NodeSpec
from apps.fleets.enforcement import enforce
from apps.fleets.models import Fleet, Node
from apps.fleets.node.runtime_api import HAProxySocket
from apps.fleets.node.transports.base import NodeConn
from apps.traffic import services as traffic_services
from tests.netutil import free_port_on

# node name -> (region, loopback address its listener binds)
NODES = {"ra1": ("ra", "127.0.0.1"), "ra2": ("ra", "127.0.0.3"), "rb1": ("rb", "127.0.0.2"),
         "rb2": ("rb", "127.0.0.4")}
ONE_PER_REGION = {"ra": ("ra", "127.0.0.1"), "rb": ("rb", "127.0.0.2")}
A_CAPACITY, B_CAPACITY = 40.0, 80.0


@dataclass
class LiveFleet:
    pool: Pool
    port: int
    nodes: dict[str, tuple[Node, NodeConn]]
    backends: dict[str, tuple[str, object]]  # member name -> (region, TinyBackend)

    def hits(self) -> dict[str, int]:
        """Requests each region's members answered so far (region -> count, every region of the pool)."""
        out: Counter[str] = Counter()
        for region, backend in self.backends.values():
            out[region] += backend.hits  # type: ignore[attr-defined]
        return dict(out)

    def limits(self, name: str) -> dict[str, int]:
        return {k: int(v) for k, v in HAProxySocket(self.nodes[name][1].stats_socket_path).show_map(LIMITS_MAP)}

    def readings(self) -> list[traffic_services.NodeReadings]:
        """Each node's `show stat`, as the fleets collector hands it to traffic."""
        return [traffic_services.NodeReadings(
                    node_id=node.pk, node=f"{node.fleet.name}/{node.name}", region=node.fleet.region.slug,
                    readings=traffic_services.readings_from_stats(HAProxySocket(conn.stats_socket_path).show_stat()))
                for node, conn in self.nodes.values()]


def node_bundle(node: Node, conn: NodeConn, address: str) -> ConfigBundle:
    """The node's config as the production path renders it for its fleet's current state."""
    snap, _ = fleet_selectors.fleet_snapshot(node.fleet, 1)
    return render(snap, NodeSpec(name=node.name, runtime_dir=conn.runtime_dir, bind_address=address))


def start(two_regions, haproxy_node, tiny_backend, *, overload: str = "absorb", policy: str | None = None,
          nodes: Mapping[str, tuple[str, str]] = NODES) -> LiveFleet:
    """Ra's members take A_CAPACITY in all and rb's B_CAPACITY; a fleet per region that has `nodes`, each node's
    config rendered by the production path (`fleet_snapshot`, `render`) and served by a real HAProxy."""
    pool = two_regions.pool
    Pool.objects.filter(pk=pool.pk).update(overload=overload, **({"overflow_policy": policy} if policy else {}))
    pool.refresh_from_db()
    PoolRegion.objects.filter(pool=pool, region=two_regions.a).update(max_rate_per_member=A_CAPACITY / 2)
    PoolRegion.objects.filter(pool=pool, region=two_regions.b).update(max_rate_per_member=B_CAPACITY / 2)
    backends = {}
    for member in Member.objects.filter(pool=pool).select_related("region"):
        backend = tiny_backend(member.name)
        backends[member.name] = (member.region.slug, backend)
        Member.objects.filter(pk=member.pk).update(address="127.0.0.1", port=backend.port)
    port = free_port_on([address for _, address in nodes.values()])
    Listener.objects.create(lb=two_regions.lb, name="web", protocol="http", port=port, default_pool=pool)
    fleets = {}
    for slug, region in (("ra", two_regions.a), ("rb", two_regions.b)):
        if any(r == slug for r, _ in nodes.values()):
            fleets[slug] = Fleet.objects.create(name=f"f{slug}", region=region)
            fleets[slug].serves.add(two_regions.lb)
    rows = {}
    for name, (region, address) in nodes.items():
        conn = haproxy_node.conn(name)
        rows[name] = (Node.objects.create(fleet=fleets[region], name=name, address="127.0.0.1",
                                          runtime_dir=conn.runtime_dir, config_dir=conn.config_dir,
                                          bind_address=address), conn)
    for name, (node, conn) in rows.items():
        bundle = node_bundle(node, conn, nodes[name][1])
        extra = {k: v for k, v in bundle.files.items() if k != "haproxy.cfg"}
        haproxy_node(lambda _conn, text=bundle.main: text, name=name, files=extra)
    return LiveFleet(pool=pool, port=port, nodes=rows, backends=backends)


class Load:
    """Open-loop load at a constant rate into one node, in a thread."""

    def __init__(self, address: str, port: int, rate: float, duration_s: float) -> None:
        self.plan = LoadPlan.constant(Target(host=address, port=port, timeout_s=5.0), rate, duration_s)
        self.result: RunResult | None = None
        self.started = time.monotonic()
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=lambda: setattr(self, "result", run_plan(self.plan, cancel=self.cancel)),
                                       daemon=True)
        self.thread.start()

    def finish(self) -> RunResult:
        """Wait for the whole plan: its result counts every request it sent."""
        self.thread.join(self.plan.max_duration_s + 5)
        assert self.result is not None, "load generator did not finish"
        return self.result

    def stop(self) -> None:
        """End the load now, for a test that is done with it (its duration is only an upper bound)."""
        self.cancel.set()
        self.thread.join(10)
        assert not self.thread.is_alive(), "load generator did not stop"


def enforce_for(seconds: float) -> list[dict]:
    runs = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.monotonic()
        runs.append(enforce())
        time.sleep(max(0.0, 1.0 - (time.monotonic() - started)))
    return runs


@dataclass
class Session:
    """One client: a cookie jar of one cookie, a request every `period_s`, the member of each answer."""

    address: str
    port: int
    period_s: float
    cookie: str = ""
    served: list[tuple[float, str]] = field(default_factory=list)  # (time, member)

    def run(self, stop: threading.Event) -> None:
        conn = None
        while not stop.is_set():
            started = time.monotonic()
            try:
                conn = conn or http.client.HTTPConnection(self.address, self.port, timeout=5)
                conn.request("GET", "/", headers={"Cookie": self.cookie} if self.cookie else {})
                answer = conn.getresponse()
                body = answer.read().decode().strip()
                set_cookie = answer.getheader("Set-Cookie")
                if set_cookie:
                    self.cookie = set_cookie.split(";", 1)[0]
                if answer.status == 200:
                    self.served.append((time.monotonic(), body))
            except (OSError, http.client.HTTPException):
                conn = None
            stop.wait(max(0.0, self.period_s - (time.monotonic() - started)))


class Clients:
    def __init__(self) -> None:
        self.stop: dict[int, threading.Event] = {}
        self.sessions: list[Session] = []
        self.threads: list[threading.Thread] = []

    def add(self, session: Session) -> None:
        stop = threading.Event()
        self.stop[id(session)] = stop
        self.sessions.append(session)
        thread = threading.Thread(target=session.run, args=(stop,), daemon=True)
        thread.start()
        self.threads.append(thread)

    def end(self, session: Session) -> None:
        self.stop[id(session)].set()

    def close(self) -> None:
        for stop in self.stop.values():
            stop.set()
        for t in self.threads:
            t.join(10)


class EnforcerThread:
    """The enforcement loop 4 times a second in a thread, as the enforcer process runs it (for transactional
    tests: the thread has its own database connection, closed when it stops)."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        from django.db import connection

        try:
            while not self.stop.is_set():
                enforce()
                self.stop.wait(0.25)
        finally:
            connection.close()

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)


def served_between(fleet: LiveFleet, seconds: float) -> dict[str, float]:
    """Enforce for `seconds`, then the members' req/s over that span (region -> req/s)."""
    before = fleet.hits()
    started = time.monotonic()
    enforce_for(seconds)
    after = fleet.hits()
    span = time.monotonic() - started
    return {r: (after.get(r, 0) - before.get(r, 0)) / span for r in ("ra", "rb")}
