"""Kinds that drive the fleets, capacity and cloud apps, through those apps' services.

Scheduling sits above fleets and beside capacity and cloud in the layer order (docs/ARCHITECTURE.md), so it
imports their services directly: a renamed service fails at import, not at 2 a.m. in a job run.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any

from apps.accounts.principal import Principal
from apps.balancers.models import LoadBalancer
from apps.capacity import services as capacity_services
from apps.capacity.models import CapacityTest
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
