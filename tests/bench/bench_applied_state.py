"""Whether every node serving an LB has a revision of it (`lb_applied_state`), as the fleet and its LB count grow.

Every parked `applied` long-poll asks this on each wake-up (every node recorded anywhere wakes them all), every
rollout asks it once per LB it changed, and the LB page once per view. A fleet serving many LBs holds one entry per
LB in each revision's `lb_revisions`; read on each node's row (as before 2026-11-29, timed here as `per_node`), a
call decoded nodes x LBs entries. Each size runs inside a transaction that is rolled back (nothing is left).

    python tests/bench/bench_applied_state.py [--sizes 67x10,67x10000,200x10000] [--calls 30]

Needs PostgreSQL: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/spw_bench_applied, created and migrated
if missing). Last line: RESULT nodes=<largest> lbs=<largest> applied_state_ms=... per_node_ms=... (wall p50 of a
call at the largest size; per_node: the read it replaced).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/spw_bench_applied")
os.environ.setdefault("SPILLWAY_TESTING", "1")


def p50_ms(call: Callable[[], object], calls: int) -> float:
    call()  # compiled, and the rows in PostgreSQL's cache
    took = []
    for _ in range(calls):
        started = time.perf_counter()
        call()
        took.append((time.perf_counter() - started) * 1000)
    return statistics.median(took)


def per_node(lb, revision: int) -> bool:
    """The read lb_applied_state made before: each node's row with its applied revision's whole lb_revisions."""
    from apps.fleets.models import Node
    from apps.fleets.queries import _fleets_serving

    rows = (Node.objects.filter(fleet__in=_fleets_serving(lb.pk, lb.fleet_id), enabled=True)
            .order_by("fleet__name", "name")
            .values_list("fleet__name", "name", "status", "applied_revision__number", "applied_revision__lb_revisions"))
    return all(number is not None and int((revs or {}).get(str(lb.pk), 0)) >= revision
               for _, _, _, number, revs in rows)


def measure(nodes: int, lbs: int, calls: int) -> tuple[float, float]:
    from django.db import transaction

    from apps.accounts.models import Organization
    from apps.balancers.models import LoadBalancer, Region
    from apps.fleets.models import ConfigRevision, Fleet, Node
    from apps.fleets.queries import lb_applied_state

    with transaction.atomic():
        fleet = Fleet.objects.create(name="bench", region=Region.objects.create(slug="bench", name="Bench"))
        org = Organization.objects.create(slug="bench", name="Bench", kind="customer")
        lb = LoadBalancer.objects.create(org=org, name="web", fleet=fleet)
        # The fleet's other LBs as their ids in the revision (the rows themselves are not read by the call).
        covered = {str(lb.pk + 1 + i): 3 for i in range(lbs - 1)} | {str(lb.pk): 3}
        revision = ConfigRevision.objects.create(fleet=fleet, number=1, text="", sha256="1" * 64, validation_ok=True,
                                                 lb_revisions=covered)
        Node.objects.bulk_create([
            Node(fleet=fleet, name=f"n{i:04d}", address="127.0.0.1", runtime_dir=f"/run/spw/n{i}",
                 config_dir=f"/etc/spw/n{i}", status="up", applied_revision=revision) for i in range(nodes)])
        assert lb_applied_state(lb, 3)[0] and per_node(lb, 3)
        now = p50_ms(lambda: lb_applied_state(lb, 3), calls)
        before = p50_ms(lambda: per_node(lb, 3), calls)
        transaction.set_rollback(True)
    return now, before


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="67x10,67x10000,200x10000", help="NODESxLBS,...")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()

    from tests.bench._db import ensure_database

    ensure_database(os.environ["DATABASE_URL"], "PreparedQuery prepares on PostgreSQL only")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    sizes = [tuple(int(v) for v in size.split("x")) for size in args.sizes.split(",")]
    result = (0.0, 0.0)
    for nodes, lbs in sizes:
        result = measure(nodes, lbs, args.calls)
        print(f"{nodes:4d} nodes, {lbs:6d} LBs in the fleet: lb_applied_state p50 {result[0]:.2f} ms, "
              f"per node rows (before) {result[1]:.2f} ms")
    nodes, lbs = sizes[-1]
    print(f"RESULT nodes={nodes} lbs={lbs} applied_state_ms={result[0]:.2f} per_node_ms={result[1]:.2f}")


if __name__ == "__main__":
    main()
