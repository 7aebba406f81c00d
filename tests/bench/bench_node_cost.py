"""What one node costs the control plane's own process, phase by phase (issue 40), without the noise of a full run.

bench-fleet-size measures a change end to end on a 2-core machine that also runs every node's HAProxy, the enforcer,
health collection and PostgreSQL: at 201 nodes a change waits for CPU, so its figures move with everything else on
the box. This one runs the same work in one process and times it there: one fleet of `--nodes` local HAProxy nodes
with `--routes` routes (tests/bench/_fleetbench.py, no Celery worker, no web server), then
- `--changes` route changes, each written as the API writes it (route, target, `lb_touch`) and rolled out by
  `fleet_reconcile` in this process: CPU per change and per node, and each phase's thread time;
- `--collections` health collections (`fleet_health_collect`) and `--runs` enforcement runs (`enforce` with the
  enforcer process's meter and topology, a capacity on every pool): CPU per node each.

    python tests/bench/bench_node_cost.py [--nodes 67] [--routes 1000] [--changes 15]

Then `--changes` more each with the prepared statements off and on in turn (apps/core/prepared.py: the ORM compiles
every statement of the change again, as before 2026-11-27).

Last line: RESULT nodes=... change_cpu_ms_per_node=... apply_ms_per_node=... record_ms_per_node=...
health_cpu_ms_per_node=... enforce_cpu_ms_per_node=... change_cpu_ms_orm=... change_cpu_ms_prepared=... (change:
the whole process's CPU; apply: apply_node's thread time, the node's own I/O; record: creating, planning and
recording the rollout around it; the last two: CPU per change with the statements compiled by the ORM, prepared).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import resource
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
os.environ.setdefault("BENCH_REDIS_URL", "redis://127.0.0.1:6379/5")

from _fleetbench import FleetBench


class InProcess(FleetBench):
    """The fleet and its nodes, without a worker or a web server: the work runs in this process."""

    def _start_worker(self, concurrency: int) -> None:
        pass

    def _start_web(self) -> None:
        pass


def cpu_s() -> float:
    used = resource.getrusage(resource.RUSAGE_SELF)
    return used.ru_utime + used.ru_stime


def sys_s() -> float:
    """The kernel's share of cpu_s (file system work: creating, linking, renaming, syncing a node's set)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_stime


@contextlib.contextmanager
def phases(spots: list[tuple[object, str, str]]) -> Iterator[Counter]:
    """Thread time spent in each (owner, attribute) while the block runs, by label; the originals are put back."""
    spent: Counter = Counter()
    originals = []
    for owner, name, label in spots:
        original = getattr(owner, name)
        originals.append((owner, name, original))

        def timed(*args, _original: Callable = original, _label: str = label, **kwargs):  # type: ignore[no-untyped-def]
            started = time.thread_time()
            try:
                return _original(*args, **kwargs)
            finally:
                spent[_label] += time.thread_time() - started

        setattr(owner, name, functools.wraps(original)(timed))
    try:
        yield spent
    finally:
        for owner, name, original in originals:
            setattr(owner, name, original)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=67)
    parser.add_argument("--routes", type=int, default=1_000)
    parser.add_argument("--changes", type=int, default=15)
    parser.add_argument("--collections", type=int, default=10)
    parser.add_argument("--runs", type=int, default=40)
    args = parser.parse_args()

    fb = InProcess("spillway_bench_node_cost", nodes_per_region=args.nodes, regions=1)
    try:
        from bench_scale import seed_routes
        from django.db import transaction

        from apps.balancers.models import PoolRegion, Route, RouteTarget
        from apps.balancers.services import lb_touch
        from apps.core import prepared
        from apps.fleets.enforcement import DemandMeter, Topology, enforce
        from apps.fleets.health.collect import fleet_health_collect
        from apps.fleets.node import apply
        from apps.fleets.node.transports.local import LocalTransport
        from apps.fleets.rollout import execute, reconcile
        from apps.fleets.services import fleet_mark_changed

        fleet, nodes = fb.fleets[0], len(fb.node_addresses)
        seed_routes(fb, args.routes)
        fleet_mark_changed(fleet=fleet)
        reconcile.fleet_reconcile(fleet_id=fleet.pk)  # the first apply: a reload on every node

        def change(i: int) -> float:
            with transaction.atomic():
                route = Route.objects.create(lb=fb.lb, org=fb.ops, hosts=[], path=f"/cost{i}", path_match="prefix",
                                             priority=60_000 + i)
                RouteTarget.objects.create(route=route, pool=fb.pools["new"], weight=100)
                lb_touch(fb.lb.pk, route_ids=[route.pk])
            started = time.monotonic()
            done = reconcile.fleet_reconcile(fleet_id=fleet.pk)
            if not done.get("rollouts"):
                raise SystemExit(f"change {i} rolled out nothing: {done}")
            return time.monotonic() - started

        for i in range(3):  # the route lane's first state, the bundle cache
            change(i)
        spots = [(reconcile, "fleet_reconcile", "reconcile"), (reconcile, "rollout_create", "rollout_create"),
                 (reconcile, "fleet_render", "render (route lane)"), (reconcile, "execute", "execute"),
                 (execute, "plan_for", "plan_for"), (execute, "apply_node", "apply_node"),
                 (execute, "_record", "_record"), (execute, "finish", "finish"),
                 (apply, "_hot_runtime", "runtime update"), (apply, "_push_or_error", "push"),
                 (LocalTransport, "config_sha256", "config_sha256"), (LocalTransport, "show_proc", "show proc")]
        with phases(spots) as spent:
            before, before_sys = cpu_s(), sys_s()
            walls = [change(i) for i in range(3, 3 + args.changes)]
            change_cpu, change_sys = cpu_s() - before, sys_s() - before_sys
        per_change = {label: seconds / args.changes * 1000.0 for label, seconds in spent.items()}
        print(f"{nodes} nodes, {args.routes} routes: a route change costs {change_cpu / args.changes * 1000:.1f} ms "
              f"of CPU ({change_cpu / args.changes / nodes * 1000:.2f} ms a node), wall p50 "
              f"{statistics.median(walls) * 1000:.0f} ms; in the kernel "
              f"{change_sys / args.changes / nodes * 1000:.2f} ms a node")
        for label, ms in sorted(per_change.items(), key=lambda kv: -kv[1]):
            print(f"  {label:22s} {ms:7.1f} ms a change {ms / nodes:6.2f} ms a node")
        record = per_change["reconcile"] - per_change["apply_node"]
        # The same changes with every statement compiled by the ORM (apps.core.prepared off), in turn with prepared
        # ones: the machine's drift over the run falls on both alike.
        cpu_by_mode: dict[bool, float] = {True: 0.0, False: 0.0}
        try:
            for i in range(2 * args.changes):
                prepared.ENABLED = i % 2 == 0
                before = cpu_s()
                change(3 + args.changes + i)
                cpu_by_mode[prepared.ENABLED] += cpu_s() - before
        finally:
            prepared.ENABLED = True
        orm_ms, prepared_ms = (cpu_by_mode[mode] / args.changes * 1000.0 for mode in (False, True))
        print(f"a route change's CPU with its statements compiled by the ORM {orm_ms:.1f} ms, prepared "
              f"{prepared_ms:.1f} ms (alternating, {args.changes} each)")

        fleet_health_collect(fleet=fleet)
        before = cpu_s()
        for _ in range(args.collections):
            fleet_health_collect(fleet=fleet)
        health = (cpu_s() - before) / args.collections
        print(f"health collection: {health * 1000:.1f} ms of CPU ({health / nodes * 1000:.2f} ms a node)")

        PoolRegion.objects.filter(pool__lb=fb.lb).update(max_rate_per_member=100_000)
        meter, topology = DemandMeter(), Topology()
        for _ in range(5):
            enforce(meter=meter, topology=topology)
        before = cpu_s()
        for _ in range(args.runs):
            enforce(meter=meter, topology=topology)
        run = (cpu_s() - before) / args.runs
        print(f"enforcement run: {run * 1000:.1f} ms of CPU ({run / nodes * 1000:.2f} ms a node; the enforcer runs "
              "4 times a second)")
        print(f"RESULT nodes={nodes} change_cpu_ms_per_node={change_cpu / args.changes / nodes * 1000:.2f} "
              f"apply_ms_per_node={per_change['apply_node'] / nodes:.2f} record_ms_per_node={record / nodes:.2f} "
              f"health_cpu_ms_per_node={health / nodes * 1000:.2f} enforce_cpu_ms_per_node={run / nodes * 1000:.2f} "
              f"change_cpu_ms_orm={orm_ms:.1f} change_cpu_ms_prepared={prepared_ms:.1f}")
    finally:
        fb.close()


if __name__ == "__main__":
    main()
