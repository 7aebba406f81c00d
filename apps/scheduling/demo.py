"""Demo jobs for `manage.py loaddemo` (idempotent): a weekly drain window, a nightly capacity change,
a heartbeat. They use the balancers demo's acme pool; without it, only the heartbeat is installed."""

from __future__ import annotations

from typing import Any

from apps.accounts.models import Organization
from apps.balancers.models import Member, PoolRegion
from apps.scheduling import services
from apps.scheduling.models import Job


def _ensure(org: Organization, name: str, **fields: Any) -> bool:
    if Job.objects.filter(org=org, name=name).exists():
        return False
    services.job_save(principal=None, job=Job(), data={"org": org, "name": name, **fields})
    return True


def load_demo() -> str | None:
    acme = Organization.objects.filter(slug="acme").first()
    if acme is None:
        return None
    created = 0
    created += _ensure(acme, "heartbeat", kind="noop", params={"message": "still here"},
                       schedule_type="interval", interval_s=300, misfire_policy="skip")
    member = Member.objects.filter(pool__org=acme, pool__name="acme-web", name="us-east-1").first()
    if member is not None:
        window = {"kind": "member_set_state", "schedule_type": "cron", "timezone": "Europe/Berlin",
                  "concurrency_policy": "forbid", "max_retries": 2, "retry_backoff_s": 30}
        created += _ensure(acme, "maintenance-drain-start", cron="0 2 * * sun",
                           params={"member": member.pk, "admin_state": "drain"}, **window)
        created += _ensure(acme, "maintenance-drain-end", cron="0 4 * * sun",
                           params={"member": member.pk, "admin_state": "active"}, **window)
    pool_region = PoolRegion.objects.filter(pool__org=acme, pool__name="acme-web", region__slug="us-east").first()
    if pool_region is not None:
        scaler = {"kind": "pool_capacity_scaler", "schedule_type": "cron", "timezone": "America/New_York"}
        created += _ensure(acme, "night-capacity-down", cron="0 23 * * *",
                           params={"pool_region": pool_region.pk, "capacity_scaler": 0.5}, **scaler)
        created += _ensure(acme, "morning-capacity-up", cron="0 6 * * *",
                           params={"pool_region": pool_region.pk, "capacity_scaler": 1.0}, **scaler)
    return f"scheduling: {created} demo job(s) created" if created else None
