"""CPU of the reads that go through PreparedQuery (apps/core/prepared.py), against the same querysets run by the ORM.

The API token lookup runs on every API call and the reconcile loop's fleet and active-rollout reads on every pass of
every reconcile (issue 40: CPU per change). Each is timed here both ways in one process, on PostgreSQL, inside a
transaction that is rolled back (nothing is left in the database).

    python tests/bench/bench_prepared.py [--calls 400]

Needs PostgreSQL: DATABASE_URL (default postgres://postgres@127.0.0.1:5432/spw_bench_prepared, created and migrated
if missing). Last line: RESULT token_orm_ms=... token_prepared_ms=... fleet_orm_ms=... fleet_prepared_ms=...
rollouts_orm_ms=... rollouts_prepared_ms=... (CPU per call, the best of five rounds).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/spw_bench_prepared")
os.environ.setdefault("SPILLWAY_TESTING", "1")


def cpu_ms(call: Callable[[], object], calls: int) -> float:
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(calls):
            call()
        best = min(best, (time.process_time() - started) / calls * 1000)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400)
    args = parser.parse_args()

    from tests.bench._db import ensure_database

    ensure_database(os.environ["DATABASE_URL"], "PreparedQuery prepares on PostgreSQL only")
    import django

    django.setup()
    from django.core.management import call_command
    from django.db import transaction
    from django.utils import timezone

    from apps.accounts.services import _TOKEN_BY_PREFIX, _token_by_prefix, token_create
    from apps.balancers.models import Region
    from apps.fleets.models import ConfigRevision, Fleet, Rollout
    from apps.fleets.rollout import reconcile
    from tests.factories import MembershipFactory, OrganizationFactory, UserFactory

    call_command("migrate", verbosity=0, interactive=False)
    results: dict[str, float] = {}
    with transaction.atomic():
        fleet = Fleet.objects.create(name="bench", region=Region.objects.create(slug="bench", name="Bench"))
        revision = ConfigRevision.objects.create(fleet=fleet, number=1, text="global\n", sha256="1" * 64,
                                                 validation_ok=True)
        Rollout.objects.create(fleet=fleet, revision=revision, status=Rollout.Status.RUNNING)
        org = OrganizationFactory(slug="bench")
        user = UserFactory(username="bench")
        MembershipFactory(user=user, org=org, role="owner")
        prefix = token_create(org=org, name="bench", scopes=["read"], user=user).secret.split("_")[1]
        now = timezone.now()
        reads = {
            "token": (lambda: _token_by_prefix(prefix, now).first(),
                      lambda: _TOKEN_BY_PREFIX.first(prefix=prefix, now=now)),
            "fleet": (lambda: reconcile._fleet_with_region(fleet.pk).first(),
                      lambda: reconcile._FLEET.first(fleet_id=fleet.pk)),
            "rollouts": (lambda: list(reconcile._active_rollouts(fleet.pk)),
                         lambda: reconcile._ACTIVE_ROLLOUTS.all(fleet_id=fleet.pk)),
        }
        for name, (orm, prepared) in reads.items():
            assert prepared() is not None and prepared() != []  # compiled, and finds the row
            results[f"{name}_orm_ms"] = cpu_ms(orm, args.calls)
            results[f"{name}_prepared_ms"] = cpu_ms(prepared, args.calls)
            print(f"{name:9s} ORM {results[f'{name}_orm_ms']:.3f} ms of CPU a call, "
                  f"prepared {results[f'{name}_prepared_ms']:.3f} ms")
        transaction.set_rollback(True)
    print("RESULT " + " ".join(f"{key}={value:.3f}" for key, value in results.items()))


if __name__ == "__main__":
    main()
