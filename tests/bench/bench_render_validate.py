"""Render and `haproxy -c` timed separately on bench_scale's route shape, in memory (no database, no nodes).

100k routes (5k hostnames x 20 prefix paths, one pool, priorities 1..5000 as seed_routes writes them):
a cold render (a fresh process: the by-value route caches are empty, as in bench_scale's render_validate),
a second render of the same snapshot (the identity memos of a rollout), then validate_bundle.
Run it under the bench lock:

    python tests/bench/bench_render_validate.py [--routes 100000] [--profile]

Last line: RESULT render_cold_ms=... render_again_ms=... validate_ms=... sha256=... (sha256 of the bundle's
files, to compare a change's output with the code before it).
"""

from __future__ import annotations

import argparse
import cProfile
import dataclasses
import hashlib
import pstats
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench_dataplane import build_snapshot
from bench_scale import HOST_ROUTES, TENANT_ROUTES

from apps.fleets.config.check import validate_bundle
from apps.fleets.config.render import render
from apps.fleets.config.spec import FleetSnapshot, NodeSpec, RouteSpec, RouteTargetSpec


def scale_snapshot(count: int) -> FleetSnapshot:
    base = build_snapshot(5, 18080, 18081)
    pool_id = base.pools[0].id
    routes = tuple(
        RouteSpec(id=i + 1, priority=1 + i % TENANT_ROUTES, hosts=(f"h{i // HOST_ROUTES}.scale.test",),
                  path_match="prefix", path=f"/p{i % HOST_ROUTES}", targets=(RouteTargetSpec(pool_id, 100),))
        for i in range(count))
    return dataclasses.replace(base, listeners=(dataclasses.replace(base.listeners[0], routes=routes),))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--routes", type=int, default=100_000)
    parser.add_argument("--profile", action="store_true", help="cProfile the cold render instead of timing it")
    args = parser.parse_args()
    snapshot = scale_snapshot(args.routes)
    node = NodeSpec(name="n1", runtime_dir="/tmp/spillway-bench-render", bind_address="127.0.0.1")
    if args.profile:
        profile = cProfile.Profile()
        profile.runcall(render, snapshot, node)
        pstats.Stats(profile).sort_stats("tottime").print_stats(25)
        return
    started = time.monotonic()
    bundle = render(snapshot, node)
    cold_ms = (time.monotonic() - started) * 1000.0
    started = time.monotonic()
    render(snapshot, node)
    again_ms = (time.monotonic() - started) * 1000.0
    result = validate_bundle(bundle, shutil.which("haproxy") or "haproxy")
    assert result.ok, result.output[:3000]
    digest = hashlib.sha256()
    for name in sorted(bundle.files):
        digest.update(name.encode() + b"\0" + bundle.files[name] + b"\0")
    print(f"RESULT render_cold_ms={cold_ms:.0f} render_again_ms={again_ms:.0f} validate_ms={result.duration_ms:.0f} "
          f"sha256={digest.hexdigest()[:16]} routes={args.routes} load1={Path('/proc/loadavg').read_text().split()[0]}")


if __name__ == "__main__":
    main()
