"""Scale out on an existing engine (issue 40): more fleet shard workers make more route changes live per second.

Each shard count runs in a child process of its own with FLEET_WORKER_SHARDS=S: a fresh database, `--fleets` fleets
of `--nodes` local HAProxy nodes each (loopback addresses), every fleet serving an LB of its own with `--routes`
routes, and the control plane as `make run` starts it (gunicorn, the default worker, one worker per fleet shard
queue, ACME's), each fleet shard worker in a process group and session of its own, as on a machine of its own.
Beat and the enforcer stay off: the bench measures what the shards do with route changes, not periodic work.

Load, closed loop: `--clients` API clients spread over the LBs, each creating a route (POST /api/v1/routes/) and
waiting until its LB's revision is applied on every node of its fleet (the `applied` long-poll), then the next,
for `--seconds`. Measured: changes live per second, each change's latency (POST until applied), the shard workers'
CPU (cores) and the whole machine's.

    python tests/bench/bench_scaleout.py [--shards 1,2,4] [--fleets 8] [--nodes 6] [--routes 500] [--clients 16]
                                         [--seconds 60]

Last line: RESULT shards=<list> changes_per_s=<list> p99_ms=<list> speedup=<last over first>. What it shows: the
changes a fleet shard makes live are bounded by one process (its interpreter lock), so shards on more cores or
machines raise throughput until the machine's cores are spent (on this 2-core machine: past 2 shard processes the
cores are, and the figure stops rising).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/7")

from _fleetbench import CHILD_MARK, child_result


def cpu_ticks(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total


def machine_busy() -> tuple[int, int]:
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return sum(values), values[3] + values[4]


def build(fb, fleets: int, nodes: int, routes: int) -> list[int]:
    """The fleets, each with an LB of its own (a pool of one local backend, `routes` routes); the LBs' ids."""
    from _fleetbench import start_fast_backends

    from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region, Route, RouteTarget
    from apps.fleets.demo.localnodes import start_local_node
    from apps.fleets.models import Fleet, Node
    from tests.netutil import free_port_on

    region = Region.objects.create(slug="us-east", name="us-east")
    backends, ports = start_fast_backends([(f"b{f}", f"127.0.99.{f + 1}") for f in range(fleets)])
    fb.procs.append(backends)
    addresses = [f"127.0.{100 + f}.{i}" for f in range(fleets) for i in range(1, nodes + 1)]
    port = free_port_on(addresses)
    lb_ids = []
    for f in range(fleets):
        fleet = Fleet.objects.create(name=f"fleet-{f}", region=region)
        lb = LoadBalancer.objects.create(org=fb.ops, name=f"lb-{f}", fleet=fleet)
        pool = Pool.objects.create(lb=lb, org=fb.ops, name="web", health_path="")
        PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=None)
        address = f"127.0.99.{f + 1}"
        Member.objects.create(pool=pool, region=region, name="web-1", address=address, port=ports[(f"b{f}", address)])
        Listener.objects.create(lb=lb, name="http", port=port, default_pool=pool)
        made = Route.objects.bulk_create([Route(lb=lb, org=fb.ops, hosts=[f"h{i // 50}.lb{f}.test"], path=f"/p{i}",
                                                path_match="prefix", priority=1 + i) for i in range(routes)])
        RouteTarget.objects.bulk_create([RouteTarget(route=r, pool=pool, weight=100) for r in made])
        for i in range(1, nodes + 1):
            node = Node.objects.create(fleet=fleet, name=f"n{i}", address=f"127.0.{100 + f}.{i}",
                                       bind_address=f"127.0.{100 + f}.{i}",
                                       runtime_dir=f"{fb.base}/{fleet.name}/n{i}/run",
                                       config_dir=f"{fb.base}/{fleet.name}/n{i}/etc")
            fb.masters.append(start_local_node(node))
        fb.fleets.append(fleet)
        lb_ids.append(lb.pk)
    return lb_ids


def one_shard_count(shards: int, fleets: int, nodes: int, routes: int, clients: int, seconds: float) -> dict:
    os.environ["FLEET_WORKER_SHARDS"] = str(shards)
    # Every client here is the operator's one token; the long-poll's per-token 600/min is for one pipeline's.
    os.environ["THROTTLE_LONGPOLL"] = "1000000/min"
    from _fleetbench import FleetBench
    from bench_propagation import percentile

    fb = FleetBench(f"spillway_bench_scaleout_{shards}", topology=False, own_sessions=True)
    try:
        from apps.fleets.services import fleet_mark_changed

        lb_ids = build(fb, fleets, nodes, routes)
        for fleet in fb.fleets:
            fleet_mark_changed(fleet=fleet)  # routes written past the services: record the change
        for lb_id in lb_ids:
            fb.wait_applied(600, lb_id=lb_id)
        shard_pids = [p.pid for p in fb.procs if any("fleets." in str(a) for a in p.args)]
        assert len(shard_pids) == shards, (shards, shard_pids)

        latencies: list[float] = []
        failures: list[str] = []
        lock = threading.Lock()
        stop = time.monotonic() + seconds
        serial = iter(range(10**9))

        def client(index: int) -> None:
            lb_id = lb_ids[index % len(lb_ids)]
            while time.monotonic() < stop:
                with lock:
                    n = next(serial)
                started = time.monotonic()
                status, body = fb.api("POST", "/api/v1/routes/", {
                    "lb": lb_id, "path": f"/c{n}", "priority": 10_000 + n, "redirect_url": f"https://c.test/{n}"})
                if status != 201:
                    failures.append(f"POST {status} {body}")
                    return
                _, lb = fb.api("GET", f"/api/v1/load-balancers/{lb_id}/")
                status, body = fb.api("GET", f"/api/v1/load-balancers/{lb_id}/applied/?revision={lb['revision']}"
                                             "&timeout=60", timeout_s=75)
                if status != 200:
                    failures.append(f"applied {status} {body}")
                    return
                with lock:
                    latencies.append((time.monotonic() - started) * 1000.0)

        ticks0, (all0, idle0) = cpu_ticks(shard_pids), machine_busy()
        began = time.monotonic()
        threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.monotonic() - began
        ticks1, (all1, idle1) = cpu_ticks(shard_pids), machine_busy()
        if failures:
            raise RuntimeError(f"{len(failures)} changes failed, first: {failures[0]}")
        return {"shards": shards, "changes": len(latencies), "changes_per_s": len(latencies) / took,
                "p50_ms": percentile(latencies, 50), "p99_ms": percentile(latencies, 99),
                "shard_cores": (ticks1 - ticks0) / os.sysconf("SC_CLK_TCK") / took,
                "machine_busy": 1 - (idle1 - idle0) / max(1, all1 - all0)}
    finally:
        fb.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shards", default="1,2,4")
    parser.add_argument("--fleets", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=6)
    parser.add_argument("--routes", type=int, default=500)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one shard count, print JSON
    args = parser.parse_args()
    shape = (args.fleets, args.nodes, args.routes, args.clients, args.seconds)
    if args.one:
        print(CHILD_MARK + json.dumps(one_shard_count(args.one, *shape)), flush=True)
        return

    print(f"{args.fleets} fleets x {args.nodes} local nodes, {args.routes} routes per LB, {args.clients} clients "
          f"(closed loop: create, then wait until live on every node), {args.seconds:.0f} s per shard count")
    print(f"{'shards':>6} {'changes/s':>10} {'p50/p99 ms':>14} {'shard cores':>12} {'machine busy':>13}")
    rows = []
    for shards in (int(s) for s in args.shards.split(",")):
        row = child_result(__file__, ["--one", str(shards), "--fleets", str(args.fleets), "--nodes", str(args.nodes),
                                      "--routes", str(args.routes), "--clients", str(args.clients), "--seconds",
                                      str(args.seconds)], f"{shards} shards")
        rows.append(row)
        print(f"{shards:6d} {row['changes_per_s']:10.1f} {row['p50_ms']:6.0f}/{row['p99_ms']:<7.0f} "
              f"{row['shard_cores']:12.2f} {row['machine_busy']:12.0%}", flush=True)
    rates = ",".join(f"{r['changes_per_s']:.1f}" for r in rows)
    p99s = ",".join(f"{r['p99_ms']:.0f}" for r in rows)
    print(f"RESULT shards={args.shards} changes_per_s={rates} p99_ms={p99s} "
          f"speedup={rows[-1]['changes_per_s'] / rows[0]['changes_per_s']:.2f}")


if __name__ == "__main__":
    main()
