"""Writes for capacity tests: define, start, cancel, apply. Each writes its audit event."""

from __future__ import annotations

import math
from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Organization
from apps.accounts.principal import Principal
from apps.audit.services import audit_record, audit_snapshot
from apps.balancers.models import Pool, PoolRegion
from apps.balancers.services import object_save
from apps.capacity import engine, safety
from apps.capacity.models import CapacityRun, CapacityTest, TargetAllowlist
from apps.capacity.selectors import org_active_load
from apps.core.errors import Conflict, DoesNotExist, DomainError, NotFoundError, save_or_conflict

MAX_STEPS = 50
MAX_SHARDS = 16
MAX_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 100


def caps_of(org: Organization) -> safety.Caps:
    return safety.Caps(max_rate=float(org.max_test_rate), max_duration_s=float(org.max_test_duration_s),
                       max_concurrency=int(org.max_test_concurrency))


def load_of(test: CapacityTest) -> safety.Load:
    if test.mode == CapacityTest.Mode.OPEN:
        return safety.Load(peak_rate=test.peak_load, schedule_s=test.schedule_s,
                           concurrency=int(test.max_connections))
    return safety.Load(peak_rate=0.0, schedule_s=test.schedule_s, concurrency=int(test.peak_load))


def normalize_steps(raw: Any, *, step_duration_s: float, mode: str) -> list[list[float]]:
    """Steps as [[rate_or_users, duration_s], ...]; a bare number takes the test's step duration."""
    if not isinstance(raw, list) or not raw:
        raise DomainError("invalid_steps", "Give at least one step.", field="steps")
    if len(raw) > MAX_STEPS:
        raise DomainError("invalid_steps", f"At most {MAX_STEPS} steps.", field="steps")
    out: list[list[float]] = []
    for i, item in enumerate(raw):
        if isinstance(item, int | float) and not isinstance(item, bool):
            value, duration = item, step_duration_s
        elif isinstance(item, list | tuple) and len(item) == 2:
            value, duration = item
        else:
            raise DomainError("invalid_steps", f"Step {i + 1} must be a number or [value, duration_s].",
                              field="steps")
        try:
            value, duration = float(value), float(duration)
        except (TypeError, ValueError):
            raise DomainError("invalid_steps", f"Step {i + 1} must hold numbers.", field="steps") from None
        if not (math.isfinite(value) and math.isfinite(duration)) or value <= 0 or not 0 < duration <= 3600:
            raise DomainError("invalid_steps", f"Step {i + 1}: the value must be > 0 and the duration in "
                                               "(0, 3600] s.", field="steps")
        if mode == CapacityTest.Mode.CLOSED:
            if value != int(value):
                raise DomainError("invalid_steps", f"Step {i + 1}: users must be a whole number.",
                                  field="steps")
            value = int(value)
        out.append([value, duration])
    return out


def capacity_test_check(test: CapacityTest) -> safety.ResolvedTarget:
    """Everything a test must satisfy, whoever wrote it: shape, pool, caps, target. Returns the target."""
    if not 0 < test.slo_p99_ms <= 60_000:
        raise DomainError("invalid_slo", "slo_p99_ms must be in (0, 60000].", field="slo_p99_ms")
    if not 0 <= test.slo_error_rate <= 1:
        raise DomainError("invalid_slo", "slo_error_rate must be between 0 and 1.", field="slo_error_rate")
    if not 1 <= test.shards <= MAX_SHARDS:
        raise DomainError("invalid_shards", f"shards must be 1..{MAX_SHARDS}.", field="shards")
    if not 0 < test.safety_factor <= 1:
        raise DomainError("invalid_safety_factor", "safety_factor must be in (0, 1].", field="safety_factor")
    if not 0 < test.timeout_s <= MAX_TIMEOUT_S:
        raise DomainError("invalid_timeout", f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}].", field="timeout_s")
    if test.mode == CapacityTest.Mode.OPEN and test.max_connections < test.shards:
        raise DomainError("invalid_connections", "max_connections must be at least the number of shards.",
                          field="max_connections")
    if test.pool_id is not None:
        pool = Pool.objects.filter(pk=test.pool_id).first()
        if pool is None or (pool.org_id != test.org_id and not test.org.is_operator):
            raise DoesNotExist("Pool not found.", field="pool")
        if test.region_id is not None and not PoolRegion.objects.filter(pool=pool, region_id=test.region_id).exists():
            raise DomainError("invalid_region", "The pool has no capacity row in that region.", field="region")
    safety.check_caps(load_of(test), caps_of(test.org))
    target = safety.target_resolve(test=test)
    plan_for(test, target)  # the engine's own checks (header injection, bounds) run here too
    return target


def plan_for(test: CapacityTest, target: safety.ResolvedTarget) -> engine.LoadPlan:
    try:
        t = engine.Target(host=target.address, port=target.port, path=target.path,
                          host_header=target.host_header, timeout_s=test.timeout_s)
        if test.mode == CapacityTest.Mode.OPEN:
            return engine.LoadPlan.open_loop(
                t, [(float(v), float(d)) for v, d in test.steps],
                max_rate=max(test.peak_load, 0.001), max_connections=int(test.max_connections))
        return engine.LoadPlan.closed_loop(t, [(int(v), float(d)) for v, d in test.steps],
                                           think_time_s=test.think_time_s)
    except ValueError as exc:
        raise DomainError("invalid_plan", f"The load engine refuses this test: {exc}.") from exc


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


def capacity_run_start(*, principal: Principal | None, test: CapacityTest) -> CapacityRun:
    """Check target and caps again (either may have changed since the test was saved), reserve the
    org's budget and enqueue the run once the transaction commits."""
    from apps.capacity.tasks import start_run_task

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
            step_count=len(test.steps))
        audit_record(principal=principal, org=org, action="capacityrun.start", obj=run,
                     after={"test": test.pk, "steps": test.steps, "mode": test.mode, "shards": test.shards})
        transaction.on_commit(lambda: start_run_task.delay(run.pk))
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
