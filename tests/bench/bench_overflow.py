"""Google's "Capacity management with load balancing" tutorial, on loopback, with Spillway's overflow.

The tutorial puts CPU-bound VMs behind a global load balancer, measures one VM's capacity (about
5 req/s), sets each region's max rate to about two-thirds of what its 3 VMs can do (10 req/s),
and sends open-loop load from near region A. With one region, latency explodes past capacity
(500 ms -> 5,000 ms); with a second region, the excess overflows and latency barely moves
(400 ms -> 700 ms).

Here: 6 members (3 in region a, 3 in region b), each a tiny asyncio HTTP server that answers one
request at a time after a fixed 200 ms (so ~5 req/s, and requests queue past that, like the
tutorial's CPU-bound server, without burning this machine's two cores). One HAProxy 2.6 node in
region a -- the entry point, where the tutorial's clients are -- runs a config rendered by
`apps.fleets.config.render` with its chains (the whole capacity of region a, then b):
  (a) regional: pool with region a only (no overflow);
  (b) overflow: pool with regions a and b, waterfall, max rate 10 req/s per region.
Open-loop load (`apps.capacity.engine`, evenly paced) at 0.5x, 1x, 1.5x, 2x and 3x of one
region's max rate, each level for --step-s seconds after the backends went idle.
engage_s: a ramp from 0.5x to 2x; time from the offered rate passing region a's max rate to
the first request reaching a region-b member.

    python tests/bench/bench_overflow.py [--step-s 12] [--service-ms 200]

Last line: ``RESULT p50_ratio_overflow_2x=... p50_ratio_regional_2x=... engage_s=...``.
Goals: overflow <= 1.3, regional >= 10, engage <= 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apps.capacity.engine import LoadPlan, Step, Target, run_plan
from apps.fleets.config.digest import set_digest
from apps.fleets.config.render import render
from apps.fleets.config.spec import (
    FleetSnapshot,
    ListenerSpec,
    MemberSpec,
    NodeSpec,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
)
from apps.fleets.node.process import start_master, stop_master
from apps.fleets.node.transports.base import NodeConn
from apps.fleets.node.transports.local import LocalTransport
from apps.traffic.overflow import RegionCapacity
from tests.netutil import pick_free_port

MULTIPLIERS = (0.5, 1.0, 1.5, 2.0, 3.0)
MEMBERS_PER_REGION = 3
REGIONS = ("a", "b")
DISTANCES = {("a", "b"): 30.0}
ADDRESS = "127.0.0.1"


# --- fixed-capacity backends ------------------------------------------------------------------------


@dataclass
class Member:
    name: str
    region: str
    service_s: float
    port: int = 0
    lock: asyncio.Lock | None = None
    waiting: int = 0  # queued or in service
    arrivals: list[float] = field(default_factory=list)  # time.monotonic() of each request

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                self.arrivals.append(time.monotonic())
                self.waiting += 1
                try:
                    assert self.lock is not None
                    async with self.lock:  # one request at a time: the rest queue, as on a busy CPU
                        await asyncio.sleep(self.service_s)
                finally:
                    self.waiting -= 1
                body = self.name.encode()
                close = b"connection: close" in head.lower()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                             + str(len(body)).encode() + (b"\r\nConnection: close" if close else b"")
                             + b"\r\n\r\n" + body)
                await writer.drain()
                if close:
                    return
        except ConnectionError:
            return
        finally:
            writer.close()


class Backends:
    """All members on one asyncio loop in a thread of their own (they only sleep)."""

    def __init__(self, service_s: float) -> None:
        self.members = [Member(f"{r}{i + 1}", r, service_s) for r in REGIONS for i in range(MEMBERS_PER_REGION)]
        self.loop = asyncio.new_event_loop()
        self.servers: list[asyncio.base_events.Server] = []
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("backends did not start")

    def _run(self, ready: threading.Event) -> None:
        asyncio.set_event_loop(self.loop)

        async def start() -> None:
            for member in self.members:
                member.lock = asyncio.Lock()
                server = await asyncio.start_server(member.handle, ADDRESS, 0, backlog=1024)
                member.port = server.sockets[0].getsockname()[1]
                self.servers.append(server)

        self.loop.run_until_complete(start())
        ready.set()
        self.loop.run_forever()

    def stop(self) -> None:
        async def close() -> None:
            for server in self.servers:
                server.close()

        asyncio.run_coroutine_threadsafe(close(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    def busy(self) -> int:
        return sum(m.waiting for m in self.members)

    def arrivals(self, region: str, since: float) -> list[float]:
        return sorted(t for m in self.members if m.region == region for t in m.arrivals if t >= since)


# --- HAProxy node -------------------------------------------------------------------------------------


class Bundle:
    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.sha256 = set_digest(files)


def snapshot(backends: Backends, region_max_rate: float, ports: dict[int, int]) -> tuple[FleetSnapshot, dict]:
    """Pool 1: region a only (regional). Pool 2: regions a and b with overflow. One listener each."""
    def members(region: str) -> tuple[MemberSpec, ...]:
        return tuple(MemberSpec(name=m.name, address=ADDRESS, port=m.port, weight=100)
                     for m in backends.members if m.region == region)

    per_member = region_max_rate / MEMBERS_PER_REGION
    caps = {r: RegionCapacity(r, MEMBERS_PER_REGION, per_member) for r in REGIONS}
    # The node is the pool's only entry point (the tutorial's clients sit next to region a): it may send region a's
    # whole capacity there, then the rest overflows (the last step takes what is left, unlimited).
    chains = {
        1: [("a", None)],
        2: [("a", math.floor(caps["a"].capacity + 1e-9)), ("b", None)],
    }
    pools = (
        PoolSpec(id=1, name="regional", algorithm="roundrobin", health=None,
                 regions=(PoolRegionSpec("a", members("a")),),
                 chain=tuple(RegionStep(r, n) for r, n in chains[1])),
        PoolSpec(id=2, name="overflow", algorithm="roundrobin", health=None,
                 regions=tuple(PoolRegionSpec(r, members(r)) for r in REGIONS),
                 chain=tuple(RegionStep(r, n) for r, n in chains[2])),
    )
    listeners = tuple(ListenerSpec(id=pid, lb="bench", name=f"l{pid}", protocol="http", address=ADDRESS,
                                   port=ports[pid], default_pool_id=pid) for pid in (1, 2))
    return FleetSnapshot(fleet="bench-a", region="a", revision=1, listeners=listeners, pools=pools), chains


def start_node(snap: FleetSnapshot, base: Path, haproxy_bin: str):
    node = NodeConn(name="bench-a", address=ADDRESS, runtime_dir=str(base / "run"), config_dir=str(base / "etc"),
                    haproxy_bin=haproxy_bin)
    bundle = render(snap, NodeSpec(name=node.name, runtime_dir=node.runtime_dir))
    pushed = LocalTransport(node).push(Bundle(dict(bundle.files)))
    if not pushed.ok:
        raise RuntimeError(f"rendered config refused:\n{pushed.validation_output}")
    return node, start_master(node.config_path, node.runtime_dir, haproxy_bin)


# --- measurement ------------------------------------------------------------------------------------------


def wait_idle(backends: Backends, timeout_s: float = 60.0) -> None:
    """Until no member has work queued, then 1.5 s more so HAProxy's 1 s session rates decay."""
    deadline = time.monotonic() + timeout_s
    while backends.busy() and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.5)


def measure_member_capacity(backends: Backends, port: int, requests: int = 10) -> float:
    """Requests/s one member sustains: `requests` sent at once to one member, completed over elapsed."""
    target = Target(host=ADDRESS, port=port, timeout_s=30.0)
    started = time.monotonic()
    result = run_plan(LoadPlan.open_loop(target, [Step(duration_s=0.01, rate=requests / 0.01)],
                                         max_requests=requests))
    elapsed = time.monotonic() - started
    ok = result.total.ok
    if ok != requests:
        raise RuntimeError(f"capacity probe: {ok}/{requests} answered")
    return requests / elapsed


def run_level(backends: Backends, port: int, rate: float, step_s: float) -> dict:
    wait_idle(backends)
    since = time.monotonic()
    result = run_plan(LoadPlan.constant(Target(host=ADDRESS, port=port, timeout_s=60.0), rate, step_s))
    step = result.total
    return {
        "rate": rate, "ok": step.ok, "errors": step.error_count, "achieved": step.ok / step_s,
        "p50_ms": step.p50_ms, "p99_ms": step.p99_ms,
        "in_a": len(backends.arrivals("a", since)), "in_b": len(backends.arrivals("b", since)),
    }


def measure_engage(backends: Backends, port: int, region_max_rate: float, ramp_s: float) -> float:
    """Ramp 0.5x -> 2x; seconds from the offered rate passing region a's max rate to region b's first request."""
    wait_idle(backends)
    low, high = 0.5 * region_max_rate, 2.0 * region_max_rate
    crossing_s = ramp_s * (region_max_rate - low) / (high - low)
    plan = LoadPlan.open_loop(Target(host=ADDRESS, port=port, timeout_s=60.0),
                              [Step(duration_s=ramp_s, rate=low, end_rate=high)])
    started = time.monotonic()
    run_plan(plan)
    first_b = backends.arrivals("b", started)
    if not first_b:
        return float("inf")
    return first_b[0] - (started + crossing_s)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--step-s", type=float, default=12.0, help="seconds per load level")
    parser.add_argument("--service-ms", type=float, default=200.0, help="fixed service time per request")
    parser.add_argument("--ramp-s", type=float, default=8.0, help="engage ramp duration")
    args = parser.parse_args()
    haproxy_bin = shutil.which("haproxy") or "/usr/sbin/haproxy"

    started = time.monotonic()
    backends = Backends(args.service_ms / 1000.0)
    base = Path(tempfile.mkdtemp(prefix="spw-bo-"))
    proc = None
    try:
        member_capacity = measure_member_capacity(backends, backends.members[0].port)
        region_capacity = member_capacity * MEMBERS_PER_REGION
        # The tutorial: max rate about two-thirds of what a region measured (3 VMs x ~5 req/s -> 10).
        region_max_rate = round(region_capacity * 2 / 3)
        ports = {1: pick_free_port(ADDRESS), 2: pick_free_port(ADDRESS)}
        snap, chains = snapshot(backends, region_max_rate, ports)
        _node, proc = start_node(snap, base, haproxy_bin)
        print(f"member capacity {member_capacity:.2f} req/s (service {args.service_ms:.0f} ms, one at a time); "
              f"region capacity {region_capacity:.1f} req/s; configured max rate {region_max_rate} req/s per region")
        print(f"chains at the region-a node: regional {chains[1]}, overflow {chains[2]}")

        rows: dict[str, list[dict]] = {"regional": [], "overflow": []}
        for label, pool_id in (("regional", 1), ("overflow", 2)):
            for m in MULTIPLIERS:
                row = run_level(backends, ports[pool_id], m * region_max_rate, args.step_s)
                row["x"] = m
                rows[label].append(row)
                print(f"  {label:8s} {m:>3}x {row['rate']:5.1f} req/s: p50 {row['p50_ms']:8.1f} ms  "
                      f"p99 {row['p99_ms']:8.1f} ms  a {row['in_a']:4d}  b {row['in_b']:4d}  errors {row['errors']}",
                      flush=True)
        engage_s = measure_engage(backends, ports[2], region_max_rate, args.ramp_s)
    finally:
        if proc is not None:
            stop_master(proc, soft_timeout_s=1.0, term_timeout_s=2.0)
        backends.stop()
        shutil.rmtree(base, ignore_errors=True)

    print()
    print(f"{'load':>5} {'req/s':>6} | {'regional p50':>12} {'p99':>9} | {'overflow p50':>12} {'p99':>9} "
          f"{'served in a':>11} {'in b':>6}")
    for reg, ovf in zip(rows["regional"], rows["overflow"], strict=True):
        print(f"{reg['x']:>4}x {reg['rate']:6.1f} | {reg['p50_ms']:10.0f}ms {reg['p99_ms']:7.0f}ms | "
              f"{ovf['p50_ms']:10.0f}ms {ovf['p99_ms']:7.0f}ms {ovf['in_a'] / args.step_s:9.1f}/s "
              f"{ovf['in_b'] / args.step_s:4.1f}/s")
    errors = sum(r["errors"] for rs in rows.values() for r in rs)

    def ratio(label: str) -> float:
        by_x = {r["x"]: r for r in rows[label]}
        return by_x[2.0]["p50_ms"] / by_x[0.5]["p50_ms"]

    overflow_ratio, regional_ratio = ratio("overflow"), ratio("regional")
    print(f"\nerrors {errors}; took {time.monotonic() - started:.0f} s. Goals: overflow <= 1.3, regional >= 10, "
          f"engage <= 2 s.")
    print(f"RESULT p50_ratio_overflow_2x={overflow_ratio:.2f} p50_ratio_regional_2x={regional_ratio:.2f} "
          f"engage_s={engage_s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
