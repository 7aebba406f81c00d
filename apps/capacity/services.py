"""Writes for capacity tests: define, start, cancel, apply. Each writes its audit event."""

from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone

from apps.accounts.models import Organization
from apps.accounts.principal import Principal
from apps.audit.services import audit_record, audit_snapshot
from apps.balancers.models import PoolRegion
from apps.balancers.services import object_save
from apps.capacity import safety
from apps.capacity.models import CapacityRun, CapacityTest, TargetAllowlist
from apps.capacity.rules import DEFAULT_MAX_CONNECTIONS, capacity_test_check, caps_of, load_of, normalize_steps
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


def capacity_run_start(*, principal: Principal | None, test: CapacityTest) -> CapacityRun:
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
            step_count=len(test.steps))
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
