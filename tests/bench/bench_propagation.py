"""API write -> served on every node: propagation latency through the whole delivery path.

2 regions x 3 local HAProxy nodes (loopback), one LB served by both fleets, a real gunicorn and a
real Celery worker. Each change POSTs a route `/c<i>/` through the REST API and measures until
every node serves it (probed over HTTP every 5 ms per node, from 100 ms after the write on). The
route is a redirect, answered by HAProxy itself: the same render -> validate -> canary -> batch
path as a pool route, but the probes do not load the test backends. `--pool-routes` measures
routes to pool `new` instead. Then a burst of back-to-back writes shows how changes coalesce.

    python tests/bench/bench_propagation.py [--changes 50] [--burst 10] [--nodes 3] [--pool-routes]

Last line: ``RESULT p50_ms=... p99_ms=...``. Goal: p50 <= 300 ms, p99 <= 1000 ms.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _fleetbench import FleetBench

# No node can serve a change before the API answered, the revision was rendered and validated and
# a canary reloaded (>= ~250 ms measured); probing starts 100 ms after the write (see wait_served).
FIRST_PROBE_S = 0.1


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[index]


def stage_report(marks: list[tuple[float, float]], totals: list[float] | None = None) -> None:
    """Where the time goes, from database timestamps: write -> revision -> rollout start -> end, and the end on the
    last fleet (a change is applied when every fleet serving its LB has it). With `totals` (each change's
    write -> seen applied, in the order of `marks`), the same stages of the slowest changes: where the tail is."""
    from apps.fleets.models import ConfigRevision, Rollout

    to_revision, to_start, to_end, to_every = [], [], [], []
    slow: list[tuple[float, float, float, float, float]] = []
    for k, ((wall, _mono), (until, _)) in enumerate(zip(marks, [*marks[1:], (float("inf"), 0.0)], strict=True)):
        revision = ConfigRevision.objects.filter(created_at__gte=_dt(wall)).order_by("created_at").first()
        window = Rollout.objects.filter(created_at__gte=_dt(wall)).order_by("created_at")
        if until != float("inf"):
            window = window.filter(created_at__lt=_dt(until))
        first_per_fleet: dict[int, Rollout] = {}
        for rollout in window:
            first_per_fleet.setdefault(rollout.fleet_id, rollout)
        rollouts = list(first_per_fleet.values())
        if revision is None or not rollouts or any(r.started_at is None or r.finished_at is None for r in rollouts):
            continue
        to_revision.append((revision.created_at.timestamp() - wall) * 1000.0)
        to_start.append((rollouts[0].started_at.timestamp() - wall) * 1000.0)
        to_end.append((rollouts[0].finished_at.timestamp() - wall) * 1000.0)
        to_every.append((max(r.finished_at for r in rollouts).timestamp() - wall) * 1000.0)
        if totals is not None:
            slow.append((totals[k], to_revision[-1], to_start[-1], to_end[-1], to_every[-1]))
    if to_end:
        print(f"stages p50 (ms after the write): revision stored {statistics.median(to_revision):.0f}, "
              f"rollout started {statistics.median(to_start):.0f}, rollout finished {statistics.median(to_end):.0f}, "
              f"on every fleet {statistics.median(to_every):.0f}")
    if slow:
        print("slowest changes, ms after the write (revision / started / finished / every fleet -> seen): " + "; ".join(
            f"{r:.0f} / {s:.0f} / {f:.0f} / {e:.0f} -> {t:.0f}" for t, r, s, f, e in sorted(slow, reverse=True)[:6]))


def _dt(wall: float):
    import datetime as dt

    return dt.datetime.fromtimestamp(wall, dt.UTC)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--changes", type=int, default=50)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=3)
    parser.add_argument("--pool-routes", action="store_true", help="routes to a pool instead of redirects")
    args = parser.parse_args()

    bench = FleetBench("spw_bench_propagation", nodes_per_region=args.nodes)
    try:
        from apps.fleets.models import NodeResult, Rollout

        bench.initial_rollout()
        latencies: list[float] = []
        api_ms: list[float] = []
        marks: list[tuple[float, float]] = []  # (wall clock at the write, monotonic at the write)
        for i in range(args.changes):
            marks.append((time.time(), time.monotonic()))
            started = time.monotonic()
            # Trailing slash: "/c1/" must not prefix-match "/c10/".
            if args.pool_routes:
                bench.add_route(f"/c{i}/", 1000 + i)
                api_ms.append((time.monotonic() - started) * 1000.0)
                served = bench.wait_served(f"/c{i}/x", "new", interval_s=0.005, not_before=started + FIRST_PROBE_S)
            else:
                bench.add_route(f"/c{i}/", 1000 + i, redirect_url=f"https://example.com/c{i}")
                api_ms.append((time.monotonic() - started) * 1000.0)
                served = bench.wait_served(f"/c{i}/x", 302, interval_s=0.005, not_before=started + FIRST_PROBE_S)
            if served - started < FIRST_PROBE_S + 0.01:
                print(f"warning: change {i} was served at the first probe; FIRST_PROBE_S is too late")
            latencies.append((served - started) * 1000.0)
            time.sleep(0.05)
        print(f"changes={len(latencies)} nodes={len(bench.node_addresses)} (2 regions)")
        print(f"propagation ms: p50={statistics.median(latencies):.0f} p90={percentile(latencies, 90):.0f} "
              f"p99={percentile(latencies, 99):.0f} max={max(latencies):.0f} min={min(latencies):.0f}")
        print(f"API write (POST /routes/) ms: p50={statistics.median(api_ms):.0f} max={max(api_ms):.0f}")
        applies = NodeResult.objects.filter(status="succeeded", rollout__created_at__gte=_dt(marks[0][0]))
        print(f"node applies: {applies.filter(reload_ms__isnull=True).count()} through runtime map updates, "
              f"{applies.filter(reload_ms__isnull=False).count()} with a reload")
        recent = NodeResult.objects.filter(status="succeeded", reload_ms__isnull=False).order_by("-id")[:120]
        reloads = [r.reload_ms for r in recent]
        pushes = [r.push_ms for r in recent if r.push_ms]
        if reloads:
            print(f"per node: push p50={statistics.median(pushes):.0f} ms, reload p50={statistics.median(reloads):.0f}"
                  f" ms, node total p50={statistics.median([r.duration_ms for r in recent]):.0f} ms")
        rollouts = list(Rollout.objects.filter(status="succeeded").order_by("-id")[:40])
        if rollouts:
            print(f"rollout duration p50={statistics.median([r.duration_ms for r in rollouts]):.0f} ms")
        stage_report(marks)

        before = Rollout.objects.count()
        started = time.monotonic()
        for j in range(args.burst):
            bench.add_route(f"/b{j}/", 5000 + j)
        served = bench.wait_served(f"/b{args.burst - 1}/x", "new")
        time.sleep(1.0)  # let any trailing rollout finish before counting
        burst_rollouts = Rollout.objects.count() - before
        print(f"burst: {args.burst} writes back to back -> {burst_rollouts} rollouts over 2 fleets, "
              f"last served {(served - started) * 1000.0:.0f} ms after the first write")
        print(f"RESULT p50_ms={statistics.median(latencies):.0f} p99_ms={percentile(latencies, 99):.0f} "
              f"changes={len(latencies)} burst_writes={args.burst} burst_rollouts={burst_rollouts}")
    finally:
        bench.close()


if __name__ == "__main__":
    main()
