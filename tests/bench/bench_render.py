"""Render + `haproxy -c` time for a shared load balancer with 1k, 5k and 20k routes.

Shape (deterministic, seeded), chosen to look like a shared LB carrying many tenants' services:
- routes/5 pools: a service typically exposes a handful of routes (paths, versions) on one pool;
- 3 regions; every pool in eu and us, every other pool in ap too; 2 members per region with HTTP
  health checks; overflow chain eu (limited) -> us (limited) -> ap or us (unlimited);
- routes/10 exact hostnames (about 10 routes per host), 5% of routes on `*.tenantN.example.net`
  wildcards, 3 any-host routes (ACME challenge, /healthz, /robots.txt: they are copied into every
  host class of the map layout, the worst case for its size), 10% exact paths, 5% canary splits,
  1% redirects.
Each figure is the median of --repeat runs; render and validate are timed separately and summed.
CPU time (renderer + haproxy child) is printed too: wall time on a shared machine includes waiting.
Goal: <= 500 ms at 5k routes and 20k/5k growth <= 4.5x.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apps.fleets.config.check import validate_bundle
from apps.fleets.config.render import render
from apps.fleets.config.spec import (
    FleetSnapshot,
    HealthCheckSpec,
    ListenerSpec,
    MemberSpec,
    NodeSpec,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
    RouteSpec,
    RouteTargetSpec,
)

HEALTH = HealthCheckSpec(path="/healthz", interval_s=2, rise=2, fall=3, expected_status=200)
NODE = NodeSpec(name="bench-1", runtime_dir="/var/lib/spillway/bench-1")


def build_snapshot(n_routes: int, seed: int = 42) -> FleetSnapshot:
    rng = random.Random(seed)
    n_pools = max(1, n_routes // 5)
    pools = []
    for p in range(n_pools):
        regions = ["eu", "us", "ap"] if p % 2 == 0 else ["eu", "us"]
        pools.append(
            PoolSpec(
                id=p + 1,
                name=f"svc-{p + 1}",
                algorithm="leastconn" if p % 3 == 0 else "roundrobin",
                health=HEALTH,
                regions=tuple(
                    PoolRegionSpec(
                        region=r,
                        members=tuple(
                            MemberSpec(
                                name=f"m{m}",
                                address=f"10.{ri}.{(p >> 8) & 255}.{(p & 255)}",
                                port=8080 + m,
                                weight=100,
                                admin_state="active",
                            )
                            for m in range(2)
                        ),
                    )
                    for ri, r in enumerate(regions)
                ),
                chain=(
                    RegionStep("eu", 50),
                    RegionStep("us", 100),
                    RegionStep(regions[-1] if len(regions) == 3 else "us", None),
                ),
            )
        )
    n_hosts = max(10, n_routes // 10)
    hosts = [f"svc{h}.tenant{h % 50}.example.com" for h in range(n_hosts)]
    priorities = rng.sample(range(1, n_routes * 10), n_routes)
    routes = []
    for i in range(n_routes):
        pool_id = i // 5 % n_pools + 1
        kind = rng.random()
        host = (f"*.tenant{rng.randrange(50)}.example.net",) if kind < 0.05 else (rng.choice(hosts),)
        path = f"/{rng.choice(['api', 'app', 'static', 'v1', 'v2'])}/{i}" + rng.choice(["", "/items", "/x/y"])
        targets = (RouteTargetSpec(pool_id, 1),)
        if rng.random() < 0.05:
            targets = (RouteTargetSpec(pool_id, 90), RouteTargetSpec(pool_id % n_pools + 1, 10))
        redirect = f"https://new.example.com/r/{i}" if rng.random() < 0.01 else None
        routes.append(
            RouteSpec(
                id=i + 1,
                priority=priorities[i],
                hosts=host,
                path_match="exact" if rng.random() < 0.1 else "prefix",
                path=path,
                targets=targets,
                redirect_url=redirect,
            )
        )
    routes += [
        RouteSpec(
            id=n_routes + 1,
            priority=0,
            hosts=(),
            path_match="prefix",
            path="/.well-known/acme-challenge/",
            targets=(RouteTargetSpec(1, 1),),
        ),
        RouteSpec(
            id=n_routes + 2, priority=1, hosts=(), path_match="exact", path="/healthz", targets=(RouteTargetSpec(1, 1),)
        ),
        RouteSpec(
            id=n_routes + 3,
            priority=n_routes * 10,
            hosts=(),
            path_match="exact",
            path="/robots.txt",
            targets=(RouteTargetSpec(min(2, n_pools), 1),),
        ),
    ]
    listener = ListenerSpec(
        id=1,
        lb="shared",
        name="http",
        protocol="http",
        address="0.0.0.0",
        port=80,
        default_pool_id=1,
        routes=tuple(routes),
    )
    return FleetSnapshot(fleet="bench", region="eu", revision=1, listeners=(listener,), pools=tuple(pools))


def _children_cpu_ms() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (usage.ru_utime + usage.ru_stime) * 1000


def measure(n_routes: int, repeat: int) -> dict[str, float]:
    snapshot = build_snapshot(n_routes)
    render_ms, validate_ms, cpu_ms = [], [], []
    bundle = None
    for _ in range(repeat):
        started, cpu_started = time.perf_counter(), time.process_time()
        bundle = render(snapshot, NODE)
        render_ms.append((time.perf_counter() - started) * 1000)
        render_cpu_ms = (time.process_time() - cpu_started) * 1000
        children_before = _children_cpu_ms()
        result = validate_bundle(bundle)
        if not result.ok:
            raise SystemExit(f"{n_routes} routes: validation failed:\n{result.output}")
        validate_ms.append(result.duration_ms)
        # CPU time as well as wall time: on a shared 2-core machine wall time mostly measures neighbours.
        cpu_ms.append(render_cpu_ms + _children_cpu_ms() - children_before)
    assert bundle is not None
    text = bundle.main
    figures = {
        "render_ms": statistics.median(render_ms),
        "validate_ms": statistics.median(validate_ms),
        "cfg_kb": len(bundle.files["haproxy.cfg"]) / 1024,
        "maps_kb": sum(len(v) for k, v in bundle.files.items() if k.startswith("maps/")) / 1024,
        "backends": text.count("\nbackend "),
        "rules": text.count("use_backend ") + text.count("http-request "),
        "map_entries": sum(v.count(b"\n") for k, v in bundle.files.items() if k.endswith(".routes.map")),
    }
    figures["total_ms"] = statistics.median(r + v for r, v in zip(render_ms, validate_ms, strict=True))
    figures["cpu_ms"] = statistics.median(cpu_ms)
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--sizes", default="1000,5000,20000")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    results = {}
    print(
        f"{'routes':>7} {'pools':>6} {'backends':>8} {'rules':>6} {'map':>7} {'cfg_kb':>7} {'maps_kb':>7} "
        f"{'render_ms':>9} {'check_ms':>8} {'total_ms':>8}"
    )
    for n in sizes:
        f = measure(n, args.repeat)
        results[n] = f
        print(
            f"{n:>7} {n // 5:>6} {f['backends']:>8} {f['rules']:>6} {f['map_entries']:>7} {f['cfg_kb']:>7.0f} "
            f"{f['maps_kb']:>7.0f} {f['render_ms']:>9.0f} {f['validate_ms']:>8.0f} {f['total_ms']:>8.0f} "
            f"{f['cpu_ms']:>7.0f}",
            flush=True,
        )
    both = {5000, 20000} <= set(results)
    growth = results[20000]["total_ms"] / results[5000]["total_ms"] if both else 0.0
    cpu_growth = results[20000]["cpu_ms"] / results[5000]["cpu_ms"] if both else 0.0
    load_1m = os.getloadavg()[0]
    print(f"load average while measuring: {load_1m:.1f} on {os.cpu_count()} cores")
    print(
        f"growth 20k/5k: {growth:.2f}x wall, {cpu_growth:.2f}x cpu (goal <= 4.5x); "
        f"5k total: {results.get(5000, {}).get('total_ms', 0):.0f} ms (goal <= 500 ms)"
    )
    keys = " ".join(f"render_validate_ms_{n // 1000}k={results[n]['total_ms']:.0f}" for n in sizes)
    cpu_keys = " ".join(f"cpu_ms_{n // 1000}k={results[n]['cpu_ms']:.0f}" for n in sizes)
    print(f"RESULT {keys} growth_5k_20k={growth:.2f} {cpu_keys} cpu_growth_5k_20k={cpu_growth:.2f} load={load_1m:.1f}")


if __name__ == "__main__":
    main()
