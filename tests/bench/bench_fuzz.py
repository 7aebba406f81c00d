"""Schemathesis against a live Spillway (gunicorn, DEBUG=0, PostgreSQL, Redis) with an operator token.

    python tests/bench/bench_fuzz.py [--max-examples 25] [--workers 2] [--max-time 0] [--seed 1]
                                     [--config-examples 2000]

Every operation of /api/v1/schema/, all checks; then config-as-code documents (tests/configfuzz.py) applied
into a seeded org by its owner and by the operator. Needs PostgreSQL: DATABASE_URL (default
postgres://postgres@127.0.0.1:5432/spw_bench_fuzz, created and migrated if missing, emptied of the
previous run's rows by re-creating it). Last line: ``RESULT cases=... server_errors=...
conformance_failures=...``; goal 0 server errors and 0 conformance failures (exits 1 otherwise).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/spw_bench_fuzz")
os.environ.setdefault("REDIS_URL", "redis://127.0.0.1:6379/3")
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("SPILLWAY_TESTING", "1")  # dev-only secrets are fine for a benchmark database
os.environ["DEBUG"] = "0"


def seed() -> str:
    """An operator org and admin with a token, a customer org; returns the operator token."""
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from apps.accounts.models import Organization, Role
    from apps.accounts.services import org_create, token_create, user_create_with_membership

    ops = org_create(slug="ops", name="Operators", kind=Organization.Kind.OPERATOR)
    acme = org_create(slug="acme", name="Acme", kind=Organization.Kind.CUSTOMER)
    user = user_create_with_membership(username="fuzz", password="fuzz-password-1", org=ops, role=Role.ADMIN)
    owner = user_create_with_membership(username="acme-fuzz", password="fuzz-password-2", org=acme, role=Role.OWNER)
    seed_config(acme)
    return (token_create(org=ops, name="fuzz", scopes=["read", "write", "deploy"], user=user).secret,
            token_create(org=acme, name="fuzz", scopes=["read", "write", "deploy"], user=owner).secret)


def seed_config(acme) -> None:
    """A small estate in acme for the config fuzz to edit (an LB, a pool in a region, a member, a route)."""
    from apps.balancers.models import LoadBalancer, Member, Pool, PoolRegion, Region, Route, RouteTarget

    region = Region.objects.create(slug="eu-west", name="EU West")
    lb = LoadBalancer.objects.create(org=acme, name="web")
    pool = Pool.objects.create(lb=lb, org=acme, name="api")
    PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=100)
    Member.objects.create(pool=pool, region=region, name="m1", address="127.0.0.11", port=8080)
    route = Route.objects.create(lb=lb, org=acme, priority=10, path="/api")
    RouteTarget.objects.create(route=route, pool=pool, weight=100)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-examples", type=int, default=25)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-time", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1, help="another seed generates other cases")
    parser.add_argument("--config-examples", type=int, default=2000, help="config documents, half each principal")
    args = parser.parse_args()
    from tests.bench._server import fresh_database, gunicorn
    from tests.fuzz import run_schemathesis

    fresh_database(os.environ["DATABASE_URL"])
    token, tenant_token = seed()
    with gunicorn() as base:
        # Config documents first: schemathesis' last pass may revoke the tokens it fuzzes with.
        from tests import configfuzz

        config = configfuzz.Tally()
        for n, who in enumerate((tenant_token, token)):
            part = configfuzz.run(base, who, "acme", examples=args.config_examples // 2, seed=args.seed + n)
            config.cases += part.cases
            config.server_errors += part.server_errors
            config.shape_errors += part.shape_errors
            for code, count in part.by_status.items():
                config.by_status[code] = config.by_status.get(code, 0) + count
        started = time.monotonic()
        result = run_schemathesis(base, token, max_examples=args.max_examples, workers=args.workers,
                                  max_time_s=args.max_time, seed=args.seed)
        elapsed = time.monotonic() - started
    for failure in result.blocking[:20]:  # what fails the run, first and whole
        print("BLOCKING", failure.replace("\n", " | ")[:3000])
    for failure in result.failures[:60]:
        # Conformance failures (ST1xx) in full: they are what must be fixed; the rest in brief.
        conformance = any(f"- ST1{d}" in failure for d in "0123456789")
        print(failure.replace("\n", " | ")[:1500 if conformance else 400])
    print("\n".join(result.output.splitlines()[-25:]))  # schemathesis' own summary (test cases per phase)
    print(f"load: {os.getloadavg()}, elapsed {elapsed:.0f} s, max_examples={args.max_examples}, seed={args.seed}")
    for line in (config.server_errors + config.shape_errors)[:20]:
        print(line)
    print(f"config documents by status: {dict(sorted(config.by_status.items()))}")
    print(config.line())
    print(result.line())
    ok = not (result.server_errors or result.conformance_failures or config.server_errors or config.shape_errors)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
