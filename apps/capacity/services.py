"""Writes for capacity tests: define, start, cancel, apply. Each writes its audit event."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Organization
from apps.accounts.principal import Principal
from apps.audit.services import audit_record, audit_snapshot
from apps.balancers.models import LoadBalancer, Pool, PoolRegion, Region
from apps.balancers.services import object_save
from apps.capacity import safety
from apps.capacity.models import CapacityRun, CapacityTest, Drill, TargetAllowlist
from apps.capacity.rules import (
    DEFAULT_MAX_CONNECTIONS,
    DRILL_DURATION_S,
    DRILL_P99_MS,
    DRILL_SHARE,
    capacity_test_check,
    caps_of,
    load_of,
    normalize_steps,
)
from apps.capacity.selectors import org_active_load
from apps.core.enqueue import enqueue
from apps.core.errors import Conflict, DomainError, NotFoundError, save_or_conflict

# --- tests -----------------------------------------------------------------------------------


def capacity_test_save(*, principal: Principal, test: CapacityTest, data: dict[str, Any]) -> CapacityTest:
    with transaction.atomic():
        before = audit_snapshot(test) if test.pk else None
        for field, value in data.items():
            setattr(test, field, value)
        if before is None and "max_connections" not in data:
            # Unless asked for, an open-loop test takes what the org's concurrency cap leaves it.
            test.max_connections = min(DEFAULT_MAX_CONNECTIONS, test.org.max_test_concurrency)
        test.steps = normalize_steps(test.steps, step_duration_s=test.step_duration_s, mode=test.mode)
        if not test.created_by:
            test.created_by = principal.actor
        capacity_test_check(test)
        save_or_conflict(test, Conflict("name_taken", f"Your organization already has a capacity test named "
                                                      f"'{test.name}'.", field="name"))
        audit_record(principal=principal, org=test.org,
                     action="capacitytest.create" if before is None else "capacitytest.update",
                     obj=test, before=before, after=audit_snapshot(test))
    return test


def capacity_test_delete(*, principal: Principal, test: CapacityTest) -> None:
    with transaction.atomic():
        if test.runs.filter(status__in=CapacityRun.ACTIVE).exists():
            raise Conflict("run_active", "A run of this test is still active; cancel it first.")
        audit_record(principal=principal, org=test.org, action="capacitytest.delete", obj=test,
                     before=audit_snapshot(test))
        test.delete()


# --- runs ------------------------------------------------------------------------------------


def capacity_run_start(*, principal: Principal | None, test: CapacityTest, for_drill: bool = False) -> CapacityRun:
    """Check target and caps again (either may have changed since the test was saved), reserve the
    org's budget and enqueue the run once the transaction commits."""
    with transaction.atomic():
        # One starter per org at a time, so two starts cannot both fit in the same budget.
        org = Organization.objects.select_for_update().get(pk=test.org_id)
        test.org = org
        capacity_test_check(test)
        load = load_of(test)
        safety.check_budget(load, org_active_load(org_id=org.pk), caps_of(org))
        run = CapacityRun.objects.create(
            test=test, requested_by=principal.actor if principal else "system",
            peak_rate=load.peak_rate, concurrency=load.concurrency, shards_total=test.shards,
            step_count=len(test.steps), for_drill=for_drill)
        audit_record(principal=principal, org=org, action="capacityrun.start", obj=run,
                     after={"test": test.pk, "steps": test.steps, "mode": test.mode, "shards": test.shards})
        transaction.on_commit(lambda: enqueue("capacity.start_run_task", run.pk))
    return run


def capacity_run_cancel(*, principal: Principal | None, run: CapacityRun) -> CapacityRun:
    """Mark the run cancelled; its shards see it within ~0.25 s and stop (the engine's cancel hook)."""
    with transaction.atomic():
        changed = CapacityRun.objects.filter(pk=run.pk, status__in=CapacityRun.ACTIVE).update(
            status=CapacityRun.Status.CANCELLED, stopped_reason="cancelled", finished_at=timezone.now())
        if not changed:
            run.refresh_from_db()
            raise Conflict("run_finished", f"The run already finished ({run.status}).")
        run.refresh_from_db()
        audit_record(principal=principal, org=run.test.org, action="capacityrun.cancel", obj=run,
                     after={"status": run.status})
    return run


def capacity_apply_recommendation(*, principal: Principal | None, run: CapacityRun) -> PoolRegion:
    """Set the pool's regional max_rate_per_member to the run's recommendation, through the normal
    audited path (object_save bumps the LB revision, and the rollout follows from lb_changed)."""
    with transaction.atomic():
        run = CapacityRun.objects.select_for_update().select_related("test__org").get(pk=run.pk)
        if run.status != CapacityRun.Status.SUCCEEDED or run.recommended_max_rate_per_member is None:
            raise Conflict("no_recommendation", "Only a succeeded run with a recommendation can be applied"
                                                + (f": {run.recommendation_note}" if run.recommendation_note else "."))
        if run.applied_at is not None:
            raise Conflict("already_applied", "This recommendation was already applied.")
        pool_region = PoolRegion.objects.select_related("pool").filter(pk=run.pool_region_id).first()
        if pool_region is None:
            raise Conflict("no_recommendation", "The pool region this run measured no longer exists.")
        if principal is not None and not principal.is_operator and pool_region.pool.org_id != principal.org_id:
            raise NotFoundError("Pool not found.")
        before = pool_region.max_rate_per_member
        object_save(principal=principal, obj=pool_region, action="capacity_apply",
                    data={"max_rate_per_member": run.recommended_max_rate_per_member})
        run.applied_at = timezone.now()
        run.applied_by = principal.actor if principal else "system"
        run.save(update_fields=["applied_at", "applied_by"])
        audit_record(principal=principal, org=run.test.org, action="capacityrun.apply", obj=run,
                     before={"max_rate_per_member": before},
                     after={"max_rate_per_member": run.recommended_max_rate_per_member,
                            "pool_region": pool_region.pk})
    return pool_region


# --- failover drills (apps/capacity/drills.py runs them) ------------------------------------

DRILLS_ACTIVE_PER_ORG = 2  # each holds a worker for its window: one org cannot take every worker


def drill_start(*, principal: Principal, pool: Pool, region: Region | str, share: float = 1.0,
                duration_s: float = 60.0, test: CapacityTest | None = None, slo_p99_ms: float | None = None,
                slo_error_rate: float = 0.01) -> Drill:
    """Check the drill and enqueue it. The pool is the caller's (scoped); the test must be the pool's org's."""
    if not principal.can_write:
        raise DomainError("read_only", "Your role cannot run drills.", status=403)
    if not Pool.objects.writable_by(principal).filter(pk=pool.pk).exists():
        raise NotFoundError("Pool not found.")
    slug = region.slug if isinstance(region, Region) else region
    pool_region = PoolRegion.objects.filter(pool=pool, region__slug=slug).select_related("region").first()
    if pool_region is None:
        raise DomainError("invalid_region", f"The pool has no region {str(slug)[:63]!r}.", field="region")
    others = PoolRegion.objects.filter(pool=pool).exclude(pk=pool_region.pk).exclude(capacity_scaler=0)
    if share >= 1.0 and not others.exists():
        raise DomainError("nothing_to_absorb", "The pool has no other region to take this region's traffic.",
                          field="region")
    if pool.lb.kind != LoadBalancer.Kind.HAPROXY:
        raise DomainError("not_haproxy", "Drills run on HAProxy fleets (a cloud LB's nodes cannot be read).")
    _range("share", share, *DRILL_SHARE)
    _range("duration_s", duration_s, *DRILL_DURATION_S)
    _range("slo_error_rate", slo_error_rate, 0.0, 1.0)
    if slo_p99_ms is not None:
        _range("slo_p99_ms", slo_p99_ms, *DRILL_P99_MS)
        if test is None:
            raise DomainError("p99_needs_test", "A p99 SLO needs a capacity test: its clients measure latency.",
                              field="slo_p99_ms")
    if test is not None and (test.org_id != pool.org_id
                             or not CapacityTest.objects.visible_to(principal).filter(pk=test.pk).exists()):
        raise NotFoundError("Capacity test not found.", field="test")  # another org's test: never its load
    with transaction.atomic():
        Organization.objects.select_for_update().get(pk=pool.org_id)  # one starter per org at a time
        if Drill.objects.filter(pool=pool, status__in=Drill.ACTIVE).exists():
            raise Conflict("drill_running", "A drill is already running on this pool.")
        if Drill.objects.filter(pool__org_id=pool.org_id, status__in=Drill.ACTIVE).count() >= DRILLS_ACTIVE_PER_ORG:
            raise DomainError("too_many_drills", f"At most {DRILLS_ACTIVE_PER_ORG} drills run at once per "
                              "organization; wait for one to finish.", status=429, retry_after_s=30)
        drill = Drill.objects.create(pool=pool, region=pool_region.region, share=share, duration_s=duration_s,
                                     test=test, slo_p99_ms=slo_p99_ms, slo_error_rate=slo_error_rate,
                                     requested_by=principal.actor)
        audit_record(principal=principal, org=pool.org, action="drill.start", obj=drill,
                     after={"pool": pool.pk, "region": slug, "share": share, "duration_s": duration_s,
                            "test": test.pk if test else None})
        transaction.on_commit(lambda: enqueue("capacity.drill_task", drill.pk))
    return drill


def drill_cancel(*, principal: Principal | None, drill: Drill) -> Drill:
    """Stop the drill: its loop sees it within a second and restores the region."""
    if principal is not None and not principal.can_write:
        raise DomainError("read_only", "Your role cannot cancel drills.", status=403)
    with transaction.atomic():
        if not Drill.objects.filter(pk=drill.pk, status__in=Drill.ACTIVE).update(
                status=Drill.Status.CANCELLED, reason="cancelled"):
            drill.refresh_from_db()
            raise Conflict("drill_finished", f"The drill already finished ({drill.status}).")
        if not Drill.objects.filter(pk=drill.pk, started_at__isnull=False).exists():
            Drill.objects.filter(pk=drill.pk).update(finished_at=timezone.now(), phase="done")  # never started
        drill.refresh_from_db()
        audit_record(principal=principal, org=drill.pool.org, action="drill.cancel", obj=drill,
                     after={"status": drill.status})
    return drill


def _range(name: str, value: object, low: float, high: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
        raise DomainError("invalid_drill", f"{name} must be a number from {low:g} to {high:g}.", field=name)


# --- allowlist -------------------------------------------------------------------------------


def allowlist_save(*, principal: Principal, entry: TargetAllowlist, data: dict[str, Any]) -> TargetAllowlist:
    if not principal.is_operator:
        raise DomainError("operator_only", "Only operators manage the capacity target allowlist.", status=403)
    with transaction.atomic():
        before = audit_snapshot(entry) if entry.pk else None
        for field, value in data.items():
            setattr(entry, field, value)
        if bool(entry.cidr) == bool(entry.hostname):
            raise DomainError("invalid_allowlist", "Give either a CIDR or a hostname.", field="cidr")
        if entry.cidr and not safety.parse_networks([entry.cidr]):
            raise DomainError("invalid_cidr", f"{entry.cidr!r} is not a CIDR.", field="cidr")
        if entry.cidr:
            entry.cidr = str(safety.parse_networks([entry.cidr])[0])
        entry.created_by = entry.created_by or principal.actor
        entry.save()
        audit_record(principal=principal, org=entry.org, action="capacityallowlist.save", obj=entry,
                     before=before, after=audit_snapshot(entry))
    return entry


def allowlist_delete(*, principal: Principal, entry: TargetAllowlist) -> None:
    if not principal.is_operator:
        raise DomainError("operator_only", "Only operators manage the capacity target allowlist.", status=403)
    with transaction.atomic():
        audit_record(principal=principal, org=entry.org, action="capacityallowlist.delete", obj=entry,
                     before=audit_snapshot(entry))
        entry.delete()
