"""Per-request cost of routing + the overflow chain at scale: first pool vs last pool vs a plain proxy.

One HAProxy 2.6 node runs a config rendered by `apps.fleets.config.render` for one listener with
--routes routes (default 100k) over --routes/5 pools (20k), each pool in two regions (eu limited,
then us) with one member; a second, plain HAProxy has one frontend and one backend. Both proxy to
the same origin (a third HAProxy answering 200 itself, so the origin costs the same for all).
`wrk` (one connection, keep-alive) measures the p50 latency of requests routed to the first pool,
to the last pool, and through the plain proxy, in --rounds rounds, each round in a shuffled order.
The machine is shared and loaded, so the figures are *paired*: per round overhead_X = p50(X) -
p50(plain) and ratio = p50(last) / p50(first) from the same few seconds, and the RESULT is the
median over rounds (a disturbed round moves one sample, not the answer). With two or more CPUs the
HAProxies run on CPU 0 (one thread each) and wrk on CPU 1, so the load generator does not steal
the proxy's CPU. The load average is printed before and after.

Before measuring, the rendered frontend is checked to be O(1) per request: its rules (http-request,
use_backend, acl lines) are the same at 1,000 routes as at --routes — the route decision is a host
map lookup (map_str, a tree), a path lookup (map_beg: HAProxy indexes `beg` patterns in a prefix
tree and returns the longest match) and the pool's chain from maps; no rule per route or pool.

    python tests/bench/bench_dataplane.py [--routes 100000] [--seconds 2] [--rounds 7]

Then, on the big node, what a reload costs at that many pools: the master's reload until `show proc` lists the
new worker, and delivery.verify after it, beside the whole `show stat` it used to read (every server's row); and the
enforcement loop's reading of the node (enforce.read_node, every 250 ms per node in production).

Last line: ``RESULT overhead_us_first=... overhead_us_last=... last_first_ratio=... reload_ms=... verify_ms=...
whole_show_stat_ms=... enforce_read_ms=...``
Goal (issue 14): last_first_ratio <= 1.2 and overhead <= 50 us.
"""

from __future__ import annotations

import argparse
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apps.fleets.config.render import render
from apps.fleets.config.spec import (
    FleetSnapshot,
    ListenerSpec,
    MemberSpec,
    NodeSpec,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
    RouteSpec,
    RouteTargetSpec,
)
from apps.fleets.node.process import start_master, stop_master
from apps.fleets.node.transports.base import NodeConn
from apps.fleets.node.transports.local import LocalTransport
from tests.netutil import pick_free_port

ROUTES_PER_POOL = 5
PATHS = ("/a", "/b", "/c", "/d", "/e")


def build_snapshot(n_routes: int, port: int, origin_port: int) -> FleetSnapshot:
    n_pools = max(1, n_routes // ROUTES_PER_POOL)
    pools = tuple(
        PoolSpec(
            id=p, name=f"svc-{p}", algorithm="roundrobin", health=None,
            regions=tuple(PoolRegionSpec(region=r, members=(MemberSpec("m1", "127.0.0.1", origin_port, 100),))
                          for r in ("eu", "us")),
            chain=(RegionStep("eu", 1_000_000), RegionStep("us", None)),
            capacities=(("eu", 1_000_000), ("us", None)),
        )
        for p in range(1, n_pools + 1)
    )
    routes = tuple(
        RouteSpec(id=i + 1, priority=i + 1, hosts=(f"s{i // ROUTES_PER_POOL + 1}.example.com",),
                  path_match="prefix", path=PATHS[i % ROUTES_PER_POOL],
                  targets=(RouteTargetSpec(i // ROUTES_PER_POOL + 1, 1),))
        for i in range(n_pools * ROUTES_PER_POOL)
    )
    listener = ListenerSpec(id=1, lb="shared", name="http", protocol="http", address="127.0.0.1", port=port,
                            default_pool_id=None, routes=routes)
    return FleetSnapshot(fleet="bench", region="eu", revision=1, listeners=(listener,), pools=pools)


def _conn(base: Path, name: str) -> NodeConn:
    return NodeConn(name=name, address="127.0.0.1", runtime_dir=str(base / "run" / name),
                    config_dir=str(base / name / "etc"), haproxy_bin=shutil.which("haproxy") or "haproxy")


def _start(base: Path, name: str, cfg: str, files: dict[str, bytes] | None = None):
    conn = _conn(base, name)
    from apps.fleets.config.spec import ConfigBundle

    bundle = ConfigBundle.of({"haproxy.cfg": cfg.encode(), **(files or {})})
    pushed = LocalTransport(conn).push(bundle)
    if not pushed.ok:
        raise SystemExit(f"{name}: config refused:\n{pushed.validation_output[:3000]}")
    return start_master(conn.config_path, conn.runtime_dir, conn.haproxy_bin)


def _simple(runtime_dir: str, body: str) -> str:
    return (f"global\n    stats socket {runtime_dir}/stats.sock mode 600 level admin\n"
            "defaults\n    mode http\n    timeout connect 5s\n    timeout client 30s\n    timeout server 30s\n"
            + body)


def _wait_port(port: int, timeout_s: float = 120.0) -> None:
    import socket

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise SystemExit(f"nothing listens on {port}")


_P50_RE = re.compile(r"^\s*50%\s+([\d.]+)(us|ms|s)\s*$", re.M)


def frontend_rules(cfg: str) -> list[str]:
    """The frontend's per-request rules (comments stripped): what HAProxy evaluates for every request."""
    rules, inside = [], False
    for line in cfg.splitlines():
        if line and not line[0].isspace():
            inside = line.startswith("frontend ")
            continue
        word = line.split(maxsplit=1)[0] if line.strip() else ""
        if inside and word in ("http-request", "use_backend", "acl", "tcp-request"):
            rules.append(line.strip())
    return rules


def check_o1(n_routes: int, big_cfg: str, port: int, origin_port: int, runtime_dir: str) -> int:
    small = render(build_snapshot(1000, port, origin_port), NodeSpec(name="big", runtime_dir=runtime_dir)).main
    small_rules, big_rules = frontend_rules(small), frontend_rules(big_cfg)
    print(f"frontend rules per request: {len(small_rules)} at 1000 routes, {len(big_rules)} at {n_routes} routes")
    if small_rules != big_rules or any(rule.startswith("acl") for rule in big_rules):
        raise SystemExit("the frontend grows with the routes: the per-request decision is not O(1)")
    return len(big_rules)


_WRK_CPU: list[str] = []  # ["taskset", "-c", "1"] when wrk gets its own CPU


def wrk_p50_us(url: str, host: str, seconds: float) -> float:
    command = [*_WRK_CPU, "wrk", "-t1", "-c1", f"-d{int(max(1, round(seconds)))}s", "--latency",
               "-H", f"Host: {host}", url]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    match = _P50_RE.search(out)
    if not match or "Non-2xx" in out:
        raise SystemExit(f"wrk output not understood or errors:\n{out}")
    value, unit = float(match.group(1)), match.group(2)
    return value * {"us": 1.0, "ms": 1000.0, "s": 1e6}[unit]


def delivery_at_scale(base: Path, bundle) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """What a reload costs on the big node, through the engine's own calls: the master's reload until `show proc`
    lists the new worker, then delivery.verify (listener probes, frontends, backend names); beside it, the whole
    `show stat` answered and parsed (what verify read before, every server's row). Median of 3 each."""
    from apps.fleets.enforcement import read_node
    from apps.fleets.node.apply import verify
    from apps.fleets.node.runtime_api import MasterSocket
    from apps.fleets.node.showstat import parse_show_stat

    conn = _conn(base, "big")
    transport = LocalTransport(conn)
    master = MasterSocket(f"{conn.runtime_dir}/master.sock", timeout_s=60)
    timings: dict[str, list[float]] = {"reload": [], "verify": [], "whole_show_stat": [], "enforce_read": []}
    for _ in range(3):
        started = time.monotonic()
        result = master.reload_and_verify(timeout_s=60)
        if not result.ok:
            raise SystemExit(f"reload failed: {result}")
        timings["reload"].append((time.monotonic() - started) * 1000.0)
        started = time.monotonic()
        problem = verify(transport, bundle, conn.address)
        timings["verify"].append((time.monotonic() - started) * 1000.0)
        if problem:
            raise SystemExit(f"verify: {problem}")
        started = time.monotonic()
        rows = parse_show_stat(transport.runtime("show stat"))
        timings["whole_show_stat"].append((time.monotonic() - started) * 1000.0)
        started = time.monotonic()
        reading = read_node(SimpleNamespace(pk=0), "bench", batch=transport.stats().batch)  # type: ignore[arg-type]
        timings["enforce_read"].append((time.monotonic() - started) * 1000.0)
        if not reading.reachable or len(reading.usable) != len(bundle.rendered_manifest.backends):
            raise SystemExit(f"enforce read: {reading.error or len(reading.usable)}")
    out = {k: statistics.median(v) for k, v in timings.items()}
    print(f"delivery at {len(bundle.manifest.backends)} backends ({len(rows)} show stat rows): reload (show proc: "
          f"new worker) {out['reload']:.0f} ms, verify {out['verify']:.0f} ms; the whole show stat answered "
          f"and parsed {out['whole_show_stat']:.0f} ms; the enforcement loop's reading of the node (every 250 ms) "
          f"{out['enforce_read']:.0f} ms")
    return out


def _django() -> None:
    """The enforcement loop's reading (enforce.read_node) lives beside Django models; given `run`, it reaches no
    database, so bench-only settings do."""
    import django

    for key, value in (("DJANGO_SETTINGS_MODULE", "controlplane.settings"), ("SECRET_KEY", "bench-only-secret-key"),
                       ("FIELD_ENCRYPTION_KEY", "bench-only-field-key")):
        os.environ.setdefault(key, value)
    django.setup()


def main() -> None:
    _django()
    parser = argparse.ArgumentParser()
    parser.add_argument("--routes", type=int, default=100_000)
    parser.add_argument("--seconds", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    load_before = os.getloadavg()
    if len(os.sched_getaffinity(0)) >= 2 and shutil.which("taskset"):
        # The HAProxies started below inherit CPU 0 (and so start one thread); wrk runs on CPU 1.
        os.sched_setaffinity(0, {0})
        _WRK_CPU[:] = ["taskset", "-c", "1"]
        print("CPU pinning: haproxy on CPU 0, wrk on CPU 1")
    base = Path(tempfile.mkdtemp(prefix="spw-dp-"))
    procs = []
    try:
        origin_port, plain_port, big_port = pick_free_port(), pick_free_port(), pick_free_port()
        procs.append(_start(base, "origin", _simple(
            str(base / "run" / "origin"),
            f"frontend fe\n    bind 127.0.0.1:{origin_port}\n    http-request return status 200 "
            "content-type text/plain string ok\n")))
        procs.append(_start(base, "plain", _simple(
            str(base / "run" / "plain"),
            f"frontend fe\n    bind 127.0.0.1:{plain_port}\n    default_backend be\n"
            f"backend be\n    server s1 127.0.0.1:{origin_port}\n")))
        started = time.monotonic()
        snap = build_snapshot(args.routes, big_port, origin_port)
        bundle = render(snap, NodeSpec(name="big", runtime_dir=str(base / "run" / "big")))
        render_s = time.monotonic() - started
        n_pools = len(snap.pools)
        print(f"rendered {args.routes} routes / {n_pools} pools in {render_s:.1f} s "
              f"({len(bundle.main.splitlines())} config lines)")
        n_rules = check_o1(args.routes, bundle.main, big_port, origin_port, str(base / "run" / "big"))
        started = time.monotonic()
        procs.append(_start(base, "big", bundle.main, {k: v for k, v in bundle.files.items() if k != "haproxy.cfg"}))
        _wait_port(big_port)
        print(f"big node validated and listening after {time.monotonic() - started:.1f} s")
        _wait_port(origin_port)
        _wait_port(plain_port)
        targets = {
            "plain": (f"http://127.0.0.1:{plain_port}/a", "x"),
            "first": (f"http://127.0.0.1:{big_port}/a", "s1.example.com"),
            "last": (f"http://127.0.0.1:{big_port}/e", f"s{n_pools}.example.com"),
        }
        for url, host in targets.values():  # warm-up
            wrk_p50_us(url, host, 1)
        samples: dict[str, list[float]] = {k: [] for k in targets}
        order = list(targets)
        shuffle = random.Random(14).shuffle
        for r in range(args.rounds):
            shuffle(order)
            for name in order:
                url, host = targets[name]
                samples[name].append(wrk_p50_us(url, host, args.seconds))
            print(f"round {r + 1} ({' '.join(order)}): "
                  + "  ".join(f"{k} p50={v[-1]:.0f}us" for k, v in samples.items()))
        # Paired per round: each overhead and ratio comes from the same few seconds of machine load.
        d_first = [f - p for f, p in zip(samples["first"], samples["plain"], strict=True)]
        d_last = [la - p for la, p in zip(samples["last"], samples["plain"], strict=True)]
        ratios = [la / f for la, f in zip(samples["last"], samples["first"], strict=True)]
        med = {k: statistics.median(v) for k, v in samples.items()}
        print(f"median of rounds' p50: plain {med['plain']:.0f} us, first {med['first']:.0f} us, "
              f"last {med['last']:.0f} us; least disturbed round: "
              + ", ".join(f"{k} {min(v):.0f} us" for k, v in samples.items()))
        print("per-round overhead first: " + " ".join(f"{d:.0f}" for d in d_first)
              + " | last: " + " ".join(f"{d:.0f}" for d in d_last)
              + " | last/first: " + " ".join(f"{x:.2f}" for x in ratios))
        delivery = delivery_at_scale(base, bundle)
        load_after = os.getloadavg()
        print(f"load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}, "
              f"after {load_after[0]:.2f} {load_after[1]:.2f} {load_after[2]:.2f}")
        print(f"RESULT overhead_us_first={statistics.median(d_first):.0f} "
              f"overhead_us_last={statistics.median(d_last):.0f} "
              f"last_first_ratio={statistics.median(ratios):.2f} frontend_rules={n_rules} "
              f"routes={args.routes} pools={n_pools} load1={load_after[0]:.2f} "
              f"reload_ms={delivery['reload']:.0f} verify_ms={delivery['verify']:.0f} "
              f"whole_show_stat_ms={delivery['whole_show_stat']:.0f} enforce_read_ms={delivery['enforce_read']:.0f}")
    finally:
        for proc in reversed(procs):
            stop_master(proc, soft_timeout_s=1.0, term_timeout_s=2.0)
        shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
