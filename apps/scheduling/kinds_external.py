"""Kinds that drive the fleets, capacity and cloud apps, through those apps' services.

Scheduling sits above fleets and beside capacity and cloud in the layer order (docs/ARCHITECTURE.md), so it
imports their services directly: a renamed service fails at import, not at 2 a.m. in a job run.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from apps.accounts.principal import Principal
from apps.balancers.models import LoadBalancer, PoolRegion
from apps.capacity import services as capacity_services
from apps.capacity.models import CapacityTest, Drill
from apps.capacity.rules import DRILL_DURATION_S, DRILL_P99_MS, DRILL_SHARE
from apps.cloud import services as cloud_services
from apps.cloud.models import CloudTarget
from apps.fleets import services as fleet_services
from apps.fleets.models import Fleet
from apps.scheduling.registry import (
    JobFailed,
    JobKind,
    Param,
    Params,
    RunCancelled,
    RunContext,
    _bad,
    _bool,
    _number,
    _only,
    _resolve_at_run,
    _visible,
    register,
)

POLL_S = 2.0


def _summary(obj: Any) -> dict[str, Any]:
    if obj is None:
        return {}
    summary: dict[str, Any] = {"id": getattr(obj, "pk", None), "repr": str(obj)[:200]}
    for attr in ("status", "number", "revision"):
        value = getattr(obj, attr, None)
        if isinstance(value, str | int | float):
            summary[attr] = value
    return summary


# --- fleets (operator infrastructure: only the operator org schedules these) -----------------


def _fleet_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"fleet"})
    pk = params.get("fleet")
    if isinstance(pk, bool) or not isinstance(pk, int) or not Fleet.objects.filter(pk=pk).exists():
        raise _bad("fleet", f"fleet {pk} not found.")
    return {"fleet": pk}


def _fleet_rollout_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    fleet = _fleet_at_run(params)
    rollout = fleet_services.fleet_push(fleet=fleet, principal=ctx.principal)
    if rollout is None:
        return {"fleet": fleet.pk, "rollout": None, "note": "nothing changed (or the render is invalid: see the fleet)"}
    return {"fleet": fleet.pk, "rollout": _summary(rollout)}


def _fleet_resync_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    fleet = _fleet_at_run(params)
    queued = fleet_services.request_reconcile(fleet_id=fleet.pk)
    return {"fleet": fleet.pk, "reconcile_queued": bool(queued)}


def _fleet_at_run(params: Params):
    fleet = Fleet.objects.filter(pk=params["fleet"]).first()
    if fleet is None:
        raise JobFailed(f"fleet {params['fleet']} no longer exists.")
    return fleet


FLEET_PARAMS = (Param("fleet", "Fleet", "ref", ref="fleet", required=True),)
register(JobKind("fleet_rollout", "Roll out a fleet", "Render the fleet's config now and roll out what changed.",
                 _fleet_validate, _fleet_rollout_execute, operator_only=True, params=FLEET_PARAMS))
register(JobKind("fleet_resync", "Re-sync a fleet", "Bring every node back to the fleet's desired revision.",
                 _fleet_validate, _fleet_resync_execute, operator_only=True, params=FLEET_PARAMS))


# --- capacity tests --------------------------------------------------------------------------


def _capacity_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"test", "wait", "apply_recommendation"})
    _visible(CapacityTest, principal, "test", params.get("test"), "capacity test")
    wait = _bool(params, "wait", default=True)
    apply = _bool(params, "apply_recommendation", default=False)
    if apply and not wait:
        raise _bad("apply_recommendation", "apply_recommendation needs wait: the run must finish first.")
    return {"test": params["test"], "wait": wait, "apply_recommendation": apply}


def _capacity_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    test = _resolve_at_run(CapacityTest, ctx, params["test"], "capacity test")
    run = capacity_services.capacity_run_start(principal=ctx.principal, test=test)
    output: dict[str, Any] = {"test": test.pk, "capacity_run": run.pk}
    if not params.get("wait", True):
        return output
    try:
        while True:
            run.refresh_from_db()
            if not run.is_active:
                break
            ctx.sleep(POLL_S)
    except RunCancelled:
        # Our run was stopped (timeout, replace, cancel): do not leave the load running behind it.
        _stop_capacity_run(ctx, run)
        raise
    output.update(status=run.status, knee_capacity_rps=run.knee_capacity_rps,
                  recommended_max_rate_per_member=run.recommended_max_rate_per_member)
    if run.status != "succeeded":
        raise JobFailed(f"capacity run {run.pk} ended {run.status}: {run.error or run.stopped_reason}")
    if params.get("apply_recommendation"):
        if run.recommended_max_rate_per_member is None:
            raise JobFailed(f"capacity run {run.pk} found no recommendation to apply: "
                            f"{run.recommendation_note}")
        pool_region = capacity_services.capacity_apply_recommendation(principal=ctx.principal, run=run)
        output["applied_to_pool_region"] = getattr(pool_region, "pk", None)
    return output


def _stop_capacity_run(ctx: RunContext, run: Any) -> None:
    with contextlib.suppress(Exception):  # already finished: nothing to stop
        capacity_services.capacity_run_cancel(principal=ctx.principal, run=run)


register(JobKind("capacity_test", "Run a capacity test",
                 "Start a capacity test; optionally wait for it and apply its recommendation.",
                 _capacity_validate, _capacity_execute,
                 params=(Param("test", "Capacity test", "ref", ref="capacity_test", required=True),
                         Param("wait", "Wait for the run to finish", "bool", default=True),
                         Param("apply_recommendation", "Apply its recommendation", "bool", default=False))))


# --- failover drills -----------------------------------------------------------------------


def _drill_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"pool_region", "share", "duration_s", "test", "slo_p99_ms", "slo_error_rate"})
    pool_region = _visible(PoolRegion, principal, "pool_region", params.get("pool_region"), "pool region")
    out: Params = {"pool_region": pool_region.pk,
                   "share": _number(params, "share", low=DRILL_SHARE[0], high=DRILL_SHARE[1], default=1.0),
                   "duration_s": _number(params, "duration_s", low=DRILL_DURATION_S[0], high=DRILL_DURATION_S[1],
                                         default=60.0),
                   "slo_error_rate": _number(params, "slo_error_rate", low=0.0, high=1.0, default=0.01),
                   "test": None, "slo_p99_ms": None}
    if params.get("test") is not None:
        test = _visible(CapacityTest, principal, "test", params.get("test"), "capacity test")
        if test.org_id != pool_region.pool.org_id:
            raise _bad("test", f"capacity test {test.pk} not found.")  # never another org's load on this pool
        out["test"] = test.pk
    if params.get("slo_p99_ms") is not None:
        if out["test"] is None:
            raise _bad("slo_p99_ms", "slo_p99_ms needs a capacity test: its clients measure latency.")
        out["slo_p99_ms"] = _number(params, "slo_p99_ms", low=DRILL_P99_MS[0], high=DRILL_P99_MS[1])
    return out


def _drill_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    pool_region = _resolve_at_run(PoolRegion, ctx, params["pool_region"], "pool region")
    test = _resolve_at_run(CapacityTest, ctx, params["test"], "capacity test") if params.get("test") else None
    drill = capacity_services.drill_start(
        principal=ctx.principal, pool=pool_region.pool, region=pool_region.region, share=params["share"],
        duration_s=params["duration_s"], test=test, slo_p99_ms=params.get("slo_p99_ms"),
        slo_error_rate=params["slo_error_rate"])
    try:
        while True:
            drill.refresh_from_db(fields=["status", "reason", "summary"])
            if not drill.is_active:
                break
            ctx.sleep(1.0)
    except RunCancelled:
        with contextlib.suppress(Exception):  # finished meanwhile
            capacity_services.drill_cancel(principal=ctx.principal, drill=drill)
        raise
    output = {"drill": drill.pk, "status": drill.status, "react_s": drill.summary.get("react_s"),
              "moved": drill.summary.get("moved")}
    if drill.status != Drill.Status.PASSED:
        raise JobFailed(f"drill {drill.pk} {drill.status}: {drill.reason}")
    return output


register(JobKind("failover_drill", "Run a failover drill",
                 "Drain a share of a pool's region for a while (optionally under a capacity test's load), check "
                 "that the other regions absorb it within their capacities and the SLO, restore, keep a report.",
                 _drill_validate, _drill_execute,
                 params=(Param("pool_region", "Pool region to drain", "ref", ref="pool_region", required=True),
                         Param("share", "Share of the region drained (0.05-1)", "number", default=1.0),
                         Param("duration_s", "Drained for (seconds)", "number", default=60.0),
                         Param("test", "Capacity test driving the load", "ref", ref="capacity_test"),
                         Param("slo_p99_ms", "SLO: p99 latency (ms, needs a test)", "number"),
                         Param("slo_error_rate", "SLO: error rate", "number", default=0.01))))


# --- cloud -----------------------------------------------------------------------------------

CLOUD_DONE = {"planned", "awaiting_approval", "applied", "failed"}


def _cloud_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"target", "lb", "approve"})
    target = _visible(CloudTarget, principal, "target", params.get("target"), "cloud target")
    lb = _visible(LoadBalancer, principal, "lb", params.get("lb"), "load balancer")
    if lb.org_id != target.org_id:
        raise _bad("lb", "The load balancer and the cloud target belong to different organizations.")
    return {"target": params["target"], "lb": params["lb"], "approve": _bool(params, "approve", default=False)}


def _cloud_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    """Plan; with approve, apply what the plan found. Without approve a changed plan waits for a person."""
    target = _resolve_at_run(CloudTarget, ctx, params["target"], "cloud target")
    lb = _resolve_at_run(LoadBalancer, ctx, params["lb"], "load balancer")
    started = time.monotonic()
    apply = cloud_services.create_apply(principal=ctx.principal, target=target, lb=lb)
    _wait_cloud(ctx, apply, CLOUD_DONE)
    if apply.status == "awaiting_approval" and params.get("approve"):
        apply = cloud_services.approve(principal=ctx.principal, apply=apply)
        _wait_cloud(ctx, apply, {"applied", "failed"})
    output = {"cloud_apply": apply.pk, "status": apply.status, "elapsed_s": round(time.monotonic() - started, 3)}
    if apply.status == "failed":
        raise JobFailed(f"cloud apply {apply.pk} failed: {apply.error[:500]}")
    return output


def _wait_cloud(ctx: RunContext, apply: Any, done: set[str]) -> None:
    while True:
        apply.refresh_from_db()
        if apply.status in done:
            return
        ctx.sleep(POLL_S)


register(JobKind("cloud_apply", "Plan / apply a cloud load balancer",
                 "Synthesize and plan the LB on the target; with approve, apply the plan.",
                 _cloud_validate, _cloud_execute,
                 params=(Param("target", "Cloud target", "ref", ref="cloud_target", required=True),
                         Param("lb", "Load balancer", "ref", ref="load_balancer", required=True),
                         Param("approve", "Apply the plan (approve)", "bool", default=False))))
