"""Cloud synthesis time in a warm worker: CloudLB -> Terraform JSON for 10, 100 and 1,000 routes.

A Spillway cloud worker imports the cdktf providers once at start (`deploy.warm`) and then synthesizes on
every change, so the figure that matters per change is `synthesize()` in a warm process: limit check +
stack construction through jsii + cdktf synth + writing and reading cdk.tf.json. The import cost is printed
separately, once.

The scale series uses GCP: 1,000 routes are within its URL map limits (100 hosts x 10 routes here), while
AWS refuses them up front. AWS's quota is 100 rules per *load balancer* (not per listener), so more
listeners would not help; only an AWS quota increase would. AWS is timed at 10 and 100 routes.

    python tests/bench/bench_synth.py [--repeat 5]

Last line: ``RESULT synth_ms_10=... synth_ms_100=... synth_ms_1000=... ...`` (medians, milliseconds).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.limits import LimitError, check_limits
from deploy.model import (
    CloudLB,
    CloudListener,
    CloudMember,
    CloudPool,
    CloudPoolRegion,
    CloudRegionNetwork,
    CloudRoute,
    HealthCheck,
    RouteTarget,
)

POOLS = 8
ROUTES_PER_HOST = 10


def bench_lb(provider: str, routes: int) -> CloudLB:
    regions = ("us-central1", "europe-west1", "asia-east1") if provider == "gcp" else ("us-east-1", "eu-west-1")
    pools = tuple(
        CloudPool(f"svc{p}", HealthCheck("/healthz", 10), tuple(
            CloudPoolRegion(region, 100.0 + p, 1.0 if r == 0 else 0.5,
                            tuple(CloudMember(f"10.{r}.{p}.{m + 1}", 8080) for m in range(3)))
            for r, region in enumerate(regions)))
        for p in range(POOLS))
    hosts = max(1, routes // ROUTES_PER_HOST)
    cloud_routes = []
    for i in range(routes):
        pool = f"svc{i % POOLS}"
        # Every fifth route is a 90/10 canary split, as a deploy pipeline would keep a few going.
        targets = ((RouteTarget(pool, 90), RouteTarget(f"svc{(i + 1) % POOLS}", 10)) if i % 5 == 0
                   else (RouteTarget(pool, 100),))
        cloud_routes.append(CloudRoute(i + 1, (f"h{i % hosts}.bench.example.com",), "prefix" if i % 3 else "exact",
                                       f"/api/v{i % 4}/svc{i}", targets))
    if provider == "gcp":
        networks = tuple(CloudRegionNetwork(r, "bench-vpc", f"{r}-b") for r in regions)
    else:
        networks = tuple(CloudRegionNetwork(r, f"vpc-{r}", subnet_ids=(f"subnet-{r}-a", f"subnet-{r}-b"))
                         for r in regions)
    return CloudLB(name=f"bench{routes}", provider=provider,  # type: ignore[arg-type]
                   project_or_account="spillway-bench" if provider == "gcp" else "123456789012",
                   regions=regions, static_ip="203.0.113.50", listeners=(CloudListener("http", 80, "svc0"),),
                   pools=pools, routes=tuple(cloud_routes), networks=networks)


def _rss_kb(status_path: Path) -> int:
    status = status_path.read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])


def node_rss_mb() -> float:
    """RSS of the jsii node processes under this one (a launcher and the kernel holding the assemblies)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents[int(entry.name)] = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    descendants, frontier = set(), {os.getpid()}
    while frontier:
        frontier = {pid for pid, ppid in parents.items() if ppid in frontier} - descendants
        descendants |= frontier
    total_kb = 0
    for pid in descendants:
        try:
            total_kb += _rss_kb(Path(f"/proc/{pid}/status"))
        except (OSError, StopIteration):
            continue
    return total_kb / 1024


def self_rss_mb() -> float:
    return _rss_kb(Path("/proc/self/status")) / 1024


SYNTHS = [0]


def time_synth(lb: CloudLB, repeat: int, workdir: Path) -> tuple[list[float], int]:
    from deploy.synth import synthesize

    SYNTHS[0] += repeat
    times_ms = []
    size = 0
    for i in range(repeat):
        outdir = workdir / f"{lb.name}-{i}"
        started = time.perf_counter()
        synthesize(lb, outdir)
        times_ms.append((time.perf_counter() - started) * 1000)
        size = (outdir / "stacks" / lb.name / "cdk.tf.json").stat().st_size
    return times_ms, size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="synthesis runs per size (the 1,000 series runs 3)")
    args = parser.parse_args()

    from deploy.synth import warm

    gcp_import_s = warm(("gcp",))
    aws_import_s = warm(("aws",))
    node_after_import_mb = node_rss_mb()
    print(f"provider import (once per worker): gcp {gcp_import_s:.1f} s, aws {aws_import_s:.1f} s; "
          f"node RSS {node_after_import_mb:.0f} MB, python RSS {self_rss_mb():.0f} MB")

    result: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="bench-synth-") as tmp:
        workdir = Path(tmp)
        # One untimed synthesis per provider: node compiles the code paths on first use, which a worker
        # pays once, not per change.
        for provider in ("gcp", "aws"):
            time_synth(bench_lb(provider, 10), 1, workdir / "warmup")
        for routes in (10, 100, 1000):
            lb = bench_lb("gcp", routes)
            started = time.perf_counter()
            assert check_limits(lb) == []
            check_ms = (time.perf_counter() - started) * 1000
            times_ms, size = time_synth(lb, args.repeat if routes < 1000 else min(args.repeat, 3), workdir)
            median = statistics.median(times_ms)
            print(f"gcp {routes:>5} routes: synth median {median:7.1f} ms  (runs "
                  f"{', '.join(f'{t:.0f}' for t in times_ms)} ms; limit check {check_ms:.1f} ms; "
                  f"cdk.tf.json {size / 1000:.0f} KB)")
            result[f"synth_ms_{routes}"] = f"{median:.0f}"
        for routes in (10, 100):
            times_ms, size = time_synth(bench_lb("aws", routes), args.repeat, workdir)
            median = statistics.median(times_ms)
            print(f"aws {routes:>5} routes: synth median {median:7.1f} ms  (runs "
                  f"{', '.join(f'{t:.0f}' for t in times_ms)} ms; cdk.tf.json {size / 1000:.0f} KB)")
            result[f"aws_synth_ms_{routes}"] = f"{median:.0f}"
        try:
            time_synth(bench_lb("aws", 1000), 1, workdir)
        except LimitError as exc:
            print(f"aws  1000 routes: refused before synthesis: {exc.violations[0].message}")

    node_end_mb = node_rss_mb()
    growth_mb = (node_end_mb - node_after_import_mb) / SYNTHS[0]
    print(f"after {SYNTHS[0]} syntheses: node RSS {node_end_mb:.0f} MB ({growth_mb:.1f} MB per synthesis: the "
          f"jsii kernel keeps every construct it was sent), python RSS {self_rss_mb():.0f} MB")
    result["node_rss_mb"] = f"{node_end_mb:.0f}"
    result["import_s_gcp"] = f"{gcp_import_s:.1f}"
    result["import_s_aws"] = f"{aws_import_s:.1f}"
    print("RESULT " + " ".join(f"{k}={v}" for k, v in result.items()))


if __name__ == "__main__":
    main()
