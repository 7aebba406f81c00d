"""What one more node costs the control plane (issue 40): the same fleet at 6, 50, 100 and 200 nodes.

Each size runs in a child process of its own: a fresh database, 3 regions (us-east, eu-west, ap-south) x N/3 local
HAProxy nodes on loopback addresses, rounded up (tests/bench/_fleetbench.py), one LB served by the three fleets
with 1,000 routes and a capacity on every pool region (so the enforcer reads and sets every node 4 times a second),
and the control plane as `make run` starts it: gunicorn, the Celery workers (default queue + fleet shards), beat (health
collection every 5 s, converge/drift every 10 s) and the enforcer process. Measured per size:
- reload rollout: the first apply of the 1,000 routes (a reload on every node), recorded -> every node applied;
- changes: `--changes` route creations through the API, each POST -> applied on every node (the long-poll);
- idle cost: over `--idle-s` s with no change, the CPU time of the control plane's processes (web, workers, beat,
  enforcer and their children; not PostgreSQL, Redis or the nodes) as cores, their RSS, and the sockets they hold.

    python tests/bench/bench_fleet_size.py [--sizes 6,50,100,200] [--changes 20] [--idle-s 30]

Last line: RESULT nodes=<largest> change_p99_ms=... reload_rollout_s=... cp_cpu_cores_per_100_nodes=...
cp_rss_mb_per_100_nodes=... cpu_flat_50_200=... (the largest over the smallest cores per 100 nodes from 50 up;
goal: change_p99_ms <= 300 at 200 nodes, cores per 100 nodes flat within 20%) cpu_slope_flat_50_200=... (the
largest over the smallest cost of 100 more nodes between sizes from 50 up: what one more node costs, without the
cost no node count changes).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")

from _fleetbench import CHILD_MARK, child_result

CP_MARKERS = ("gunicorn", "celery", "manage.py enforcer")
# Where a change's CPU goes, by process (bench_scale.cpu_by_process: the first key in the command line).
KINDS = (("--queues fleets.", "shard workers"), ("--queues celery", "default worker"), (" beat", "beat"),
         ("enforcer", "enforcer"), ("gunicorn", "web"), ("haproxy", "nodes' haproxy"), ("postgres", "postgres"),
         ("redis", "redis"), ("bench_fleet_size", "bench client"), ("_fleetbench", "backends"))
REGIONS = 3


def control_plane_pids(roots: list[int]) -> list[int]:
    """The control plane's processes: `roots` that are web / worker / beat / enforcer, and their descendants."""
    parents: dict[int, int] = {}
    cmdlines: dict[int, str] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmdlines[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        parents[int(proc.name)] = int(stat[1])
    chosen = {pid for pid in roots if any(m in cmdlines.get(pid, "") for m in CP_MARKERS)}
    grew = True
    while grew:
        children = {pid for pid, parent in parents.items() if parent in chosen} - chosen
        chosen |= children
        grew = bool(children)
    return sorted(chosen)


def usage(pids: list[int]) -> tuple[float, float, int]:
    """(CPU seconds so far, RSS MB, sockets held) summed over `pids` (those still alive)."""
    ticks = os.sysconf("SC_CLK_TCK")
    cpu = rss = 0.0
    sockets = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            cpu += (int(fields[11]) + int(fields[12])) / ticks
            rss += int(fields[21]) * os.sysconf("SC_PAGE_SIZE") / 2**20
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                try:
                    sockets += os.readlink(fd).startswith("socket:")
                except OSError:
                    continue
        except OSError:
            continue
    return cpu, rss, sockets


def one_size(nodes: int, changes: int, idle_s: float) -> dict[str, float]:
    from _fleetbench import FleetBench
    from bench_propagation import percentile
    from bench_scale import cpu_by_process, machine_cpu_s, one_change, rollout_all, seed_routes

    fb = FleetBench("spillway_bench_fleet_size", nodes_per_region=-(-nodes // REGIONS), worker_concurrency=2,
                    beat=True, regions=REGIONS)
    try:
        from apps.balancers.models import PoolRegion

        # A capacity everywhere: the enforcer then works on every node of the LB, as for any LB with overflow.
        PoolRegion.objects.filter(pool__lb=fb.lb).update(max_rate_per_member=100_000)
        seed_routes(fb, 1_000)
        reload_s = rollout_all(fb, 900)
        warm = [one_change(fb, 10_000 + i, []) for i in range(3)]  # each shard process's first full render
        machine_0, kinds_0 = machine_cpu_s(), cpu_by_process(KINDS)
        took = sorted(one_change(fb, i, []) for i in range(changes))
        kinds_1 = cpu_by_process(KINDS)
        by_kind = {k: (kinds_1[k] - kinds_0.get(k, 0.0)) / changes * 1000.0 for k in kinds_1}
        # The whole machine's CPU per change (control plane, PostgreSQL, the nodes' HAProxy, the bench's client):
        # near 2 cores x the change's wall time means it waits for CPU, not for anything else.
        machine_ms = (machine_cpu_s() - machine_0) / changes * 1000.0
        time.sleep(5.0)  # the changes' after-work (drift checks) is done
        pids = control_plane_pids([p.pid for p in fb.procs])
        cpu_0, _, _ = usage(pids)
        idle_0 = cpu_by_process(KINDS)
        time.sleep(idle_s)
        cpu_1, rss, sockets = usage(pids)
        idle_1 = cpu_by_process(KINDS)
        idle_by_kind = {k: round((idle_1[k] - idle_0.get(k, 0.0)) / idle_s, 3) for k in idle_1}
        return {"nodes": len(fb.node_addresses), "reload_rollout_s": reload_s, "change_p50_ms": percentile(took, 50),
                "change_p99_ms": percentile(took, 99), "change_max_ms": max(took),
                "change_ms": [round(t) for t in took],
                "machine_cpu_ms": machine_ms,
                "machine_cpu_ms_by_kind": {k: round(v, 1) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])
                                           if v >= 1.0},
                "warm_ms": max(warm),
                "cp_cores": (cpu_1 - cpu_0) / idle_s,
                "idle_cores_by_kind": dict(sorted(((k, v) for k, v in idle_by_kind.items() if v >= 0.005),
                                                  key=lambda kv: -kv[1])), "cp_rss_mb": rss, "cp_sockets": sockets,
                "cp_processes": len(pids)}
    finally:
        fb.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="6,50,100,200")
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--idle-s", type=float, default=30.0)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: measure one size, print JSON
    args = parser.parse_args()
    if args.one:
        print(CHILD_MARK + json.dumps(one_size(args.one, args.changes, args.idle_s)), flush=True)
        return

    rows = []
    print(f"{'nodes':>5} {'reload rollout s':>16} {'change p50/p99/max ms':>22} {'cp cores':>9} "
          f"{'cores/100 nodes':>15} {'cp RSS MB':>9} {'sockets':>7}", flush=True)
    for size in (int(s) for s in args.sizes.split(",")):
        started = time.monotonic()
        row = child_result(__file__, ["--one", str(size), "--changes", str(args.changes), "--idle-s",
                                      str(args.idle_s)], f"{size} nodes")
        rows.append(row)
        print(f"{row['nodes']:5d} {row['reload_rollout_s']:16.1f} "
              f"{row['change_p50_ms']:8.0f}/{row['change_p99_ms']:.0f}/{row['change_max_ms']:.0f}".ljust(45)
              + f" {row['cp_cores']:9.3f} {row['cp_cores'] / row['nodes'] * 100:15.3f} {row['cp_rss_mb']:9.0f} "
              f"{row['cp_sockets']:7d}   ({time.monotonic() - started:.0f} s)", flush=True)
        print(f"      machine CPU per change {row['machine_cpu_ms']:.0f} ms (all processes; 2 cores give "
              f"{2 * row['change_p50_ms']:.0f} ms in the p50 change's time): "
              + ", ".join(f"{k} {v:.0f}" for k, v in row["machine_cpu_ms_by_kind"].items()), flush=True)
        print("      idle, cores: " + ", ".join(f"{k} {v:.3f}" for k, v in row["idle_cores_by_kind"].items()),
              flush=True)
    last = rows[-1]
    per_100 = [r["cp_cores"] / r["nodes"] * 100 for r in rows if r["nodes"] >= 48]
    flat = max(per_100) / min(per_100) if per_100 else float("nan")
    # What one more node costs: the slope between two sizes (the total also holds what no node count changes, which
    # makes cores per 100 nodes fall as the fleet grows: cpu_flat_50_200 above 1). Flat per-node cost is a slope
    # that holds from size to size: cpu_slope_flat_50_200 is the largest over the smallest slope from 50 nodes up.
    slopes = [(b["cp_cores"] - a["cp_cores"]) / ((b["nodes"] - a["nodes"]) / 100)
              for a, b in itertools.pairwise(rows) if a["nodes"] >= 48]
    slope_flat = max(slopes) / min(slopes) if slopes and min(slopes) > 0 else float("nan")
    for a, b in itertools.pairwise(rows):
        more = (b["nodes"] - a["nodes"]) / 100
        print(f"{a['nodes']} -> {b['nodes']} nodes: +{(b['cp_cores'] - a['cp_cores']) / more:.3f} cores and "
              f"+{(b['cp_rss_mb'] - a['cp_rss_mb']) / more:.0f} MB per 100 more nodes; change p50 "
              f"+{(b['change_p50_ms'] - a['change_p50_ms']) / more / 100:.1f} ms per node")
    print(f"goals: change_p99_ms <= 300 at 200 nodes; cores per 100 nodes flat within 20% from 50 up "
          f"(largest / smallest {flat:.2f}; below 1 would mean growing per node)")
    print(f"RESULT nodes={last['nodes']} change_p99_ms={last['change_p99_ms']:.0f} "
          f"reload_rollout_s={last['reload_rollout_s']:.1f} "
          f"cp_cpu_cores_per_100_nodes={last['cp_cores'] / last['nodes'] * 100:.3f} "
          f"cp_rss_mb_per_100_nodes={last['cp_rss_mb'] / last['nodes'] * 100:.0f} cpu_flat_50_200={flat:.2f} "
          f"cpu_slope_flat_50_200={slope_flat:.2f}")


if __name__ == "__main__":
    main()
