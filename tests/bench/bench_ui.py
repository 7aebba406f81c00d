"""Server time of the dashboard (and its live partials) and of an LB workspace, at two data sizes.

Full size: 200 load balancers, 2,000 members, 20 HAProxy nodes and 30 days of traffic history,
stored the way the app keeps it after 30 days of running: raw TrafficSample rows (one per node and
pool every 5 s) for the raw retention (2 h), 10 s overflow points for a day, 5 min points for 30 days
(traffic.services retention). Besides: config revisions, rollouts with per-node results, the `show
stat` hot copy of every node (some servers failing), capacity states and audit events. The small
size is a tenth of it (20 LBs, 200 members, 4 nodes, 3 days); query counts must be equal at both.

Each page is requested in-process with Django's test Client as an operator (no network, so the time
is the server's: middleware, queries, template), 50 times after a warm-up; p50/p95 and the queries
of one request are printed per page.

    python tests/bench/bench_ui.py [--requests 50] [--sizes small,full]

Needs PostgreSQL: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/spw_bench_ui, created and
migrated if missing; its tables are emptied and rebuilt on every run, since the history is relative
to now). Last line: ``RESULT dashboard_p95_ms=... lb_p95_ms=... queries=...`` (queries: the
dashboard page's, at full size). Goal: p95 <= 300 ms each, and the same query counts at both sizes
(exits 1 when they differ).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench._db import ensure_database  # noqa: E402

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/spw_bench_ui")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/5")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("SPILLWAY_TESTING", "1")  # dev-only secrets are fine for a benchmark database
os.environ["DEBUG"] = "0"  # DEBUG keeps every query in memory: not what production measures

warnings.filterwarnings("ignore", message="No directory at")  # whitenoise: static files not collected

GOAL_MS = 300.0
NODE_EVERY_S = 5  # fleets collect `show stat` (and record raw samples) every 5 s
REGIONS = ("us-east", "eu-west")
CUSTOMERS = 10
PASSWORD = "bench-ui-password"  # a throwaway benchmark database


@dataclass(frozen=True)
class Size:
    name: str
    lbs: int
    members: int
    nodes: int
    days: int
    audit_per_lb: int = 250
    revisions_per_fleet: int = 30


SIZES = {
    "small": Size("small", lbs=20, members=200, nodes=4, days=3),
    "full": Size("full", lbs=200, members=2000, nodes=20, days=30),
}


def empty_tables() -> None:
    """Every table of Spillway's apps, its users and sessions (not Django's own bookkeeping)."""
    from django.apps import apps
    from django.db import connection

    tables = [m._meta.db_table for m in apps.get_models(include_auto_created=True)
              if m._meta.app_label not in ("contenttypes", "admin") and not m._meta.proxy]
    existing = set(connection.introspection.table_names())
    with connection.cursor() as cursor:
        cursor.execute("TRUNCATE {} RESTART IDENTITY CASCADE".format(
            ", ".join(f'"{t}"' for t in tables if t in existing and t != "auth_permission")))


@contextmanager
def bulk_load(cursor, tables: list[str]) -> Iterator[None]:
    """Drop the secondary indexes, unique and foreign-key constraints of `tables` while millions of
    rows go in, and build them once afterwards (several times faster than maintaining them per row)."""
    restore: list[str] = []
    for table in tables:
        cursor.execute("SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint "
                       "WHERE conrelid = %s::regclass AND contype IN ('u', 'f')", [table])
        constraints = cursor.fetchall()
        cursor.execute("SELECT indexname, indexdef FROM pg_indexes WHERE tablename = %s "
                       "AND indexname NOT LIKE '%%_pkey'", [table])
        indexes = [(n, d) for n, d in cursor.fetchall() if n not in {c for c, _ in constraints}]
        for name, _ in constraints:
            cursor.execute(f'ALTER TABLE "{table}" DROP CONSTRAINT "{name}"')
        for name, _ in indexes:
            cursor.execute(f'DROP INDEX "{name}"')
        restore += [definition for _, definition in indexes]
        restore += [f'ALTER TABLE "{table}" ADD CONSTRAINT "{name}" {definition}' for name, definition in constraints]
    yield
    started = time.monotonic()
    cursor.execute("SET maintenance_work_mem = '256MB'")
    for statement in restore:
        cursor.execute(statement)
    print(f"  indexes and constraints rebuilt in {time.monotonic() - started:.1f} s", flush=True)


# --- data -----------------------------------------------------------------------------------------------


def build(size: Size) -> dict[str, int]:
    """Fill the database for `size`; returns row counts of the big tables."""
    from django.contrib.auth import get_user_model
    from django.db import connection, transaction
    from django.utils import timezone

    from apps.accounts.models import Membership, Organization, Role
    from apps.audit.models import AuditEvent
    from apps.balancers.models import (
        Listener,
        LoadBalancer,
        Member,
        Pool,
        PoolRegion,
        Region,
        RegionDistance,
        Route,
        RouteTarget,
    )
    from apps.fleets.models import ConfigRevision, Fleet, Node, NodeHealth, NodeResult, Rollout
    from apps.traffic.models import CapacityState, OverflowPoint, TrafficSample

    now = timezone.now().replace(microsecond=0)
    with transaction.atomic():
        ops = Organization.objects.create(slug="ops", name="Operations", kind="operator")
        customers = Organization.objects.bulk_create(
            [Organization(slug=f"cust{i}", name=f"Customer {i}", kind="customer") for i in range(CUSTOMERS)])
        user_model = get_user_model()
        for username, org in (("operator", ops), ("customer", customers[0])):
            user = user_model.objects.create_user(username=username, password=PASSWORD)
            Membership.objects.create(user=user, org=org, role=Role.ADMIN)
        regions = Region.objects.bulk_create([Region(slug=s, name=s) for s in REGIONS])
        RegionDistance.objects.bulk_create([RegionDistance(src=a, dst=b, rtt_ms=80) for a in regions
                                            for b in regions if a != b])

        # Half the fleets per region, nodes spread evenly; LB i is served by one fleet in each region.
        per_region = max(1, size.nodes // 10)
        fleets = Fleet.objects.bulk_create([
            Fleet(name=f"fleet-{r.slug}-{k}", region=r, desired_revision=size.revisions_per_fleet)
            for r in regions for k in range(per_region)])
        nodes_per_fleet = size.nodes // len(fleets)
        nodes = Node.objects.bulk_create([
            Node(fleet=f, name=f"n{k}", address=f"10.{f.pk}.0.{k + 1}", runtime_dir=f"/run/spw/{f.name}/n{k}",
                 config_dir=f"/etc/spw/{f.name}/n{k}", status="up", last_seen=now)
            for f in fleets for k in range(nodes_per_fleet)])
        us_fleets, eu_fleets = fleets[:per_region], fleets[per_region:]

        # 10% shared LBs (operator-owned, two tenants' pools of 5 members), the rest dedicated (one pool
        # of 10): 2,000 members for 200 LBs.
        shared_n = size.lbs // 10
        lbs = LoadBalancer.objects.bulk_create([
            LoadBalancer(name=f"lb-{i:04d}", org=ops if i < shared_n else customers[i % CUSTOMERS],
                         shared=i < shared_n, fleet=us_fleets[i % per_region], revision=5)
            for i in range(size.lbs)])
        Fleet.serves.through.objects.bulk_create([
            Fleet.serves.through(fleet_id=eu_fleets[i % per_region].pk, loadbalancer_id=lb.pk)
            for i, lb in enumerate(lbs)])
        Listener.objects.bulk_create([Listener(lb=lb, name="http", port=80) for lb in lbs])
        pools: list[Pool] = []
        for i, lb in enumerate(lbs):
            owners = [customers[(i + k) % CUSTOMERS] for k in range(2)] if lb.shared else [lb.org]
            pools += [Pool(lb=lb, org=org, name=f"{org.slug}-web") for org in owners]
        pools = Pool.objects.bulk_create(pools)
        PoolRegion.objects.bulk_create([PoolRegion(pool=p, region=r, max_rate_per_member=50)
                                        for p in pools for r in regions])
        per_pool = {p.pk: (5 if p.lb.shared else 10) for p in pools}
        Member.objects.bulk_create([
            Member(pool=p, region=regions[m % 2], name=f"m{m}", address=f"10.200.{p.pk % 250}.{m + 1}",
                   port=8000 + p.pk, admin_state="drain" if m == 7 else "active")
            for p in pools for m in range(per_pool[p.pk])])
        routes = Route.objects.bulk_create([
            Route(lb=p.lb, org=p.org, hosts=[f"{p.name}.{p.lb.name}.example.com"], path="/",
                  priority=100 + k) for k, p in enumerate(pools)])
        RouteTarget.objects.bulk_create([RouteTarget(route=r, pool=p, weight=100) for r, p in zip(routes, pools,
                                                                                                  strict=True)])

        revisions = ConfigRevision.objects.bulk_create([
            ConfigRevision(fleet=f, number=n, text=("backend filler\n    server s 10.0.0.1:80\n" * 1500),
                           sha256=f"{f.pk:032x}{n:032x}", diff="+ server s\n" * 200, validation_ok=True,
                           lb_revisions={str(lb.pk): 5 for lb in lbs})
            for f in fleets for n in range(1, size.revisions_per_fleet + 1)])
        latest = {r.fleet_id: r for r in revisions if r.number == size.revisions_per_fleet}
        for k, node in enumerate(nodes):
            node.applied_revision = latest[node.fleet_id]
            node.status = "down" if k == 1 else "drifted" if k == 2 else "up"
        Node.objects.bulk_update(nodes, ["applied_revision", "status"])
        rollouts = Rollout.objects.bulk_create([
            Rollout(fleet_id=r.fleet_id, revision=r, from_revision=r.number - 1, actor="system",
                    status="running" if r.number == size.revisions_per_fleet else
                    "failed" if r.number % 7 == 0 else "succeeded",
                    started_at=now, finished_at=now, duration_ms=900.0)
            for r in revisions])
        by_fleet: dict[int, list[Node]] = {}
        for node in nodes:
            by_fleet.setdefault(node.fleet_id, []).append(node)
        NodeResult.objects.bulk_create([
            NodeResult(rollout=r, node=n, status="pending" if r.status == "running" and k else "succeeded")
            for r in rollouts for k, n in enumerate(by_fleet[r.fleet_id])])

        CapacityState.objects.bulk_create([CapacityState(pool=p, region=r.slug, healthy_members=per_pool[p.pk] // 2,
                                                         capacity=per_pool[p.pk] // 2 * 50.0)
                                           for p in pools for r in regions])
        AuditEvent.objects.bulk_create([
            AuditEvent(actor="user:1", org=customers[k % CUSTOMERS], action="route.update", object_type="route",
                       object_id=str(k), object_repr=f"route {k}")
            for k in range(size.lbs * size.audit_per_lb)], batch_size=5000)

    # The big time series, generated inside PostgreSQL (millions of rows).
    ts = {"op": OverflowPoint._meta.db_table, "ts": TrafficSample._meta.db_table, "nh": NodeHealth._meta.db_table,
          "pool": Pool._meta.db_table, "member": Member._meta.db_table, "node": Node._meta.db_table,
          "fleet": Fleet._meta.db_table, "lb": LoadBalancer._meta.db_table, "region": Region._meta.db_table,
          "serves": Fleet.serves.through._meta.db_table}
    # Demand follows a daily wave per pool; a pool's region capacity is 50 req/s per healthy member.
    point_sql = """
        INSERT INTO {op} (pool_id, time, resolution_s, region, capacity, demand, local, "out", inflow,
                          out_to, in_from, utilization, nodes)
        SELECT p.id, t, %(res)s, r.slug, c.cap, d.demand, LEAST(d.demand, c.cap), GREATEST(d.demand - c.cap, 0),
               0, '{{}}'::jsonb, '{{}}'::jsonb, LEAST(d.demand, c.cap) / c.cap, %(nodes)s
        FROM {pool} p
        CROSS JOIN {region} r
        JOIN (SELECT pool_id, count(*) / 2 * 50.0 AS cap FROM {member} GROUP BY pool_id) c ON c.pool_id = p.id
        CROSS JOIN generate_series(%(start)s::timestamptz, %(end)s::timestamptz, %(step)s * interval '1 second') t
        CROSS JOIN LATERAL (SELECT c.cap * (0.6 + 0.6 * sin(extract(epoch FROM t) / 13751.0 + p.id)) AS demand) d
        ORDER BY t, p.id, r.slug
    """.format(**ts)  # noqa: S608 (table names from the models, no input)
    # Raw samples: every node, every pool of the LBs its fleet serves, every 5 s.
    sample_sql = """
        INSERT INTO {ts} (time, pool_id, node_id_ref, node, region, request_rate, sessions, served_local,
                          sent_to, totals)
        SELECT t, p.id, n.id, f.name || '/' || n.name, r.slug, 20 + (p.id %% 7), 3, 20, '{{}}'::jsonb, '{{}}'::jsonb
        FROM {node} n JOIN {fleet} f ON f.id = n.fleet_id JOIN {region} r ON r.id = f.region_id
        JOIN {lb} lb ON lb.fleet_id = f.id OR lb.id IN (SELECT loadbalancer_id FROM {serves} s WHERE s.fleet_id = f.id)
        JOIN {pool} p ON p.lb_id = lb.id
        CROSS JOIN generate_series(%(start)s::timestamptz, %(end)s::timestamptz, interval '5 seconds') t
        ORDER BY t, n.id, p.id
    """.format(**ts)  # noqa: S608 (table names from the models, no input)
    # The `show stat` hot copy: per node, a BACKEND row and one row per member for each pool region;
    # about 1 in 40 servers fails its check (down everywhere or "UP 1/3" on some nodes).
    health_sql = """
        INSERT INTO {nh} (node_id, proxy, server, status, check_status, weight, sessions, rate_per_s,
                          requests_total, updated_at)
        SELECT n.id, 'p' || p.id || '_' || r.slug, m.name,
               CASE WHEN m.id %% 40 = 0 THEN 'DOWN' WHEN m.id %% 40 = 1 AND n.id %% 2 = 0 THEN 'UP 1/3'
                    WHEN m.admin_state = 'drain' THEN 'DRAIN' ELSE 'UP' END,
               CASE WHEN m.id %% 40 = 0 THEN 'L4CON' WHEN m.id %% 40 = 1 AND n.id %% 2 = 0 THEN 'L7STS'
                    ELSE 'L7OK' END, 100, 1, 2, 1000, %(now)s
        FROM {node} n JOIN {fleet} f ON f.id = n.fleet_id
        JOIN {lb} lb ON lb.fleet_id = f.id OR lb.id IN (SELECT loadbalancer_id FROM {serves} s WHERE s.fleet_id = f.id)
        JOIN {pool} p ON p.lb_id = lb.id
        JOIN {member} m ON m.pool_id = p.id JOIN {region} r ON r.id = m.region_id
        UNION ALL
        SELECT n.id, 'p' || p.id || '_' || r.slug, 'BACKEND', 'UP', '', NULL, 5, 40, 100000, %(now)s
        FROM {node} n JOIN {fleet} f ON f.id = n.fleet_id
        JOIN {lb} lb ON lb.fleet_id = f.id OR lb.id IN (SELECT loadbalancer_id FROM {serves} s WHERE s.fleet_id = f.id)
        JOIN {pool} p ON p.lb_id = lb.id CROSS JOIN {region} r
    """.format(**ts)  # noqa: S608 (table names from the models, no input)
    from apps.traffic import selectors, services

    def bucket(seconds: int) -> object:
        return services.bucket_start(now, seconds)

    coarse_end = bucket(selectors.COARSE_RESOLUTION_S) - timedelta(seconds=selectors.COARSE_RESOLUTION_S)
    fine_days = min(size.days, services.FINE_RETENTION_S // 86400)
    raw_s = min(size.days * 86400, services.RAW_RETENTION_S)
    with connection.cursor() as cursor, bulk_load(cursor, [ts["op"], ts["ts"]]):
        for name, sql, params in (
            ("5 min points", point_sql, {"res": selectors.COARSE_RESOLUTION_S, "nodes": nodes_per_fleet,
                                         "start": coarse_end - timedelta(days=size.days), "end": coarse_end,
                                         "step": selectors.COARSE_RESOLUTION_S}),
            ("10 s points", point_sql, {"res": selectors.FINE_RESOLUTION_S, "nodes": nodes_per_fleet,
                                        "start": bucket(selectors.FINE_RESOLUTION_S) - timedelta(days=fine_days),
                                        "end": bucket(selectors.FINE_RESOLUTION_S),
                                        "step": selectors.FINE_RESOLUTION_S}),
            ("raw samples", sample_sql, {"start": bucket(NODE_EVERY_S) - timedelta(seconds=raw_s),
                                         "end": bucket(NODE_EVERY_S)}),
            ("hot copy", health_sql, {"now": now}),
        ):
            started = time.monotonic()
            cursor.execute(sql, params)
            print(f"  {name}: {cursor.rowcount:,} rows in {time.monotonic() - started:.1f} s", flush=True)
    started = time.monotonic()
    with connection.cursor() as cursor:
        # What autovacuum does in production (it is off on this machine): planner statistics, and
        # the visibility map index-only scans need.
        cursor.execute("VACUUM ANALYZE")
    print(f"  vacuum analyze: {time.monotonic() - started:.1f} s", flush=True)
    return {
        "lbs": LoadBalancer.objects.count(), "members": Member.objects.count(), "nodes": Node.objects.count(),
        "overflow_points": OverflowPoint.objects.count(), "traffic_samples": TrafficSample.objects.count(),
        "node_health": NodeHealth.objects.count(), "rollouts": Rollout.objects.count(),
        "audit_events": AuditEvent.objects.count(),
    }


# --- measuring ------------------------------------------------------------------------------------------


def pages() -> dict[str, str]:
    from apps.balancers.models import LoadBalancer

    # The busiest workspace: a shared LB (two tenants' routes and pools).
    lb = LoadBalancer.objects.filter(shared=True).order_by("pk").first() or LoadBalancer.objects.first()
    return {
        "dashboard": "/",
        "dashboard 1h": "/?window=1h",
        "dashboard 24h": "/?window=24h",
        "panel fleets": "/dashboard/fleets/",
        "panel checks": "/dashboard/checks/",
        "panel overflow": "/dashboard/overflow/",
        "panel rollouts": "/dashboard/rollouts/",
        "panel audit": "/dashboard/audit/",
        "panel lbs": "/dashboard/lbs/",
        "lb workspace": f"/load-balancers/{lb.pk}/",
    }


def measure(username: str, urls: dict[str, str], requests: int) -> dict[str, dict[str, float]]:
    from django.db import connection
    from django.test import Client
    from django.test.utils import CaptureQueriesContext

    client = Client()
    if not client.login(username=username, password=PASSWORD):
        raise SystemExit(f"could not log in as {username}")
    results = {}
    for name, url in urls.items():
        for _ in range(5):  # warm-up: templates compiled, connections open, caches filled
            response = client.get(url)
            if response.status_code != 200:
                raise SystemExit(f"{url}: HTTP {response.status_code}")
        with CaptureQueriesContext(connection) as ctx:
            client.get(url)
        queries = len(ctx.captured_queries)  # now: the next request clears the connection's log
        times = []
        for _ in range(requests):
            started = time.perf_counter()
            client.get(url)
            times.append((time.perf_counter() - started) * 1000.0)
        times.sort()
        results[name] = {"p50": statistics.median(times), "p95": times[max(0, round(0.95 * len(times)) - 1)],
                         "queries": queries}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--sizes", default="small,full")
    args = parser.parse_args()
    ensure_database(os.environ["DATABASE_URL"], "the page timings are PostgreSQL query plans")

    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    runs = {}
    for key in args.sizes.split(","):
        size = SIZES[key]
        empty_tables()
        started = time.monotonic()
        counts = build(size)
        print(f"\n== {size.name}: built in {time.monotonic() - started:.0f} s: "
              + ", ".join(f"{k}={v:,}" for k, v in counts.items()), flush=True)
        urls = pages()
        runs[key] = {"operator": measure("operator", urls, args.requests),
                     "customer": measure("customer", {"dashboard": "/"}, args.requests)}
        print(f"{'page (operator)':<18} {'p50 ms':>8} {'p95 ms':>8} {'queries':>8}")
        for name, r in runs[key]["operator"].items():
            print(f"{name:<18} {r['p50']:8.1f} {r['p95']:8.1f} {r['queries']:8d}")
        c = runs[key]["customer"]["dashboard"]
        print(f"{'dashboard (cust.)':<18} {c['p50']:8.1f} {c['p95']:8.1f} {c['queries']:8d}", flush=True)

    last = runs[args.sizes.split(",")[-1]]
    if len(runs) > 1:
        counts = [{name: r["queries"] for name, r in run["operator"].items()} for run in runs.values()]
        same = all(c == counts[0] for c in counts)
        print(f"\nquery counts equal at every size: {'yes' if same else 'NO: ' + repr(counts)}")
    else:
        same = True
    dash, lb = last["operator"]["dashboard"], last["operator"]["lb workspace"]
    ok = dash["p95"] <= GOAL_MS and lb["p95"] <= GOAL_MS and same
    print(f"goal p95 <= {GOAL_MS:.0f} ms each and constant query counts: {'met' if ok else 'NOT met'}")
    print(f"RESULT dashboard_p95_ms={dash['p95']:.1f} lb_p95_ms={lb['p95']:.1f} queries={dash['queries']}")
    if not same:  # timings depend on the machine; a query count that grows with rows is a bug
        sys.exit(1)


if __name__ == "__main__":
    main()
