"""Schemathesis against a live Spillway (gunicorn, DEBUG=0, PostgreSQL, Redis) with an operator token.

    python tests/bench/bench_fuzz.py [--max-examples 25] [--workers 2] [--max-time 0] [--seed 1]

Every operation of /api/v1/schema/, all checks. Needs PostgreSQL: DATABASE_URL (default
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
    org_create(slug="acme", name="Acme", kind=Organization.Kind.CUSTOMER)
    user = user_create_with_membership(username="fuzz", password="fuzz-password-1", org=ops, role=Role.ADMIN)
    return token_create(org=ops, name="fuzz", scopes=["read", "write", "deploy"], user=user).secret


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-examples", type=int, default=25)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-time", type=int, default=0)
    parser.add_argument("--seed", type=int, default=1, help="another seed generates other cases")
    args = parser.parse_args()
    from tests.bench._server import fresh_database, gunicorn
    from tests.fuzz import run_schemathesis

    fresh_database(os.environ["DATABASE_URL"])
    token = seed()
    with gunicorn() as base:
        started = time.monotonic()
        result = run_schemathesis(base, token, max_examples=args.max_examples, workers=args.workers,
                                  max_time_s=args.max_time, seed=args.seed)
        elapsed = time.monotonic() - started
    for failure in result.failures[:60]:
        # Conformance failures (ST1xx) in full: they are what must be fixed; the rest in brief.
        conformance = any(f"- ST1{d}" in failure for d in "0123456789")
        print(failure.replace("\n", " | ")[:1500 if conformance else 400])
    print("\n".join(result.output.splitlines()[-25:]))  # schemathesis' own summary (test cases per phase)
    print(f"load: {os.getloadavg()}, elapsed {elapsed:.0f} s, max_examples={args.max_examples}, seed={args.seed}")
    print(result.line())
    return 0 if result.server_errors == 0 and result.conformance_failures == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
