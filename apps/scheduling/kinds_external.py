"""Kinds that call the fleets, capacity and cloud apps. Their service functions are looked up when a
job is saved or runs, so a deployment without (or before) one of those apps still loads."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from django.apps import apps as django_apps

from apps.accounts.principal import Principal
from apps.scheduling.kinds import (
    JobFailed,
    JobKind,
    Params,
    RunCancelled,
    RunContext,
    _bad,
    _bool,
    _only,
    _resolve_at_run,
    _service,
    _visible,
    register,
)

# Candidate names, first match wins: the owning apps name their services <entity>_<action>.
FLEET_ROLLOUT = ("apps.fleets.services", ("fleet_rollout_start", "rollout_start", "fleet_rollout"))
FLEET_RESYNC = ("apps.fleets.services", ("fleet_resync", "fleet_sync", "fleet_reconcile"))
CAPACITY_START = ("apps.capacity.services", ("capacity_run_start",))
CAPACITY_CANCEL = ("apps.capacity.services", ("capacity_run_cancel",))
CAPACITY_APPLY = ("apps.capacity.services", ("capacity_apply_recommendation",))
CLOUD_APPLY = ("apps.cloud.services", ("cloud_apply_start", "cloud_apply", "cloud_apply_create"))
CAPACITY_POLL_S = 2.0


def _model(app_label: str, name: str):
    try:
        return django_apps.get_model(app_label, name)
    except LookupError:
        return None


def _has(spec: tuple[str, tuple[str, ...]]) -> bool:
    return _service(*spec) is not None


def _call(spec: tuple[str, tuple[str, ...]], **kwargs: Any) -> Any:
    func = _service(*spec)
    if func is None:
        raise JobFailed(f"{spec[0]} has no {' / '.join(spec[1])} in this installation.")
    return func(**kwargs)


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
    fleet_model = _model("fleets", "Fleet")
    pk = params.get("fleet")
    if isinstance(pk, bool) or not isinstance(pk, int) or not fleet_model.objects.filter(pk=pk).exists():
        raise _bad("fleet", f"fleet {pk} not found.")
    return {"fleet": pk}


def _fleet_execute(spec: tuple[str, tuple[str, ...]]):
    def execute(ctx: RunContext, params: Params) -> dict[str, Any]:
        fleet = _model("fleets", "Fleet").objects.filter(pk=params["fleet"]).first()
        if fleet is None:
            raise JobFailed(f"fleet {params['fleet']} no longer exists.")
        result = _call(spec, principal=ctx.principal, fleet=fleet)
        return {"fleet": fleet.pk, "result": _summary(result)}

    return execute


register(JobKind("fleet_rollout", "Roll out a fleet", "Render, validate and roll out the fleet's config.",
                 _fleet_validate, _fleet_execute(FLEET_ROLLOUT), available=lambda: _has(FLEET_ROLLOUT),
                 operator_only=True))
register(JobKind("fleet_resync", "Re-sync a fleet", "Bring every node back to the fleet's desired revision.",
                 _fleet_validate, _fleet_execute(FLEET_RESYNC), available=lambda: _has(FLEET_RESYNC),
                 operator_only=True))


# --- capacity tests --------------------------------------------------------------------------


def _capacity_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"test", "wait", "apply_recommendation"})
    _visible(_model("capacity", "CapacityTest"), principal, "test", params.get("test"), "capacity test")
    wait = _bool(params, "wait", default=True)
    apply = _bool(params, "apply_recommendation", default=False)
    if apply and not wait:
        raise _bad("apply_recommendation", "apply_recommendation needs wait: the run must finish first.")
    return {"test": params["test"], "wait": wait, "apply_recommendation": apply}


def _capacity_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    test = _resolve_at_run(_model("capacity", "CapacityTest"), ctx, params["test"], "capacity test")
    run = _call(CAPACITY_START, principal=ctx.principal, test=test)
    output: dict[str, Any] = {"test": test.pk, "capacity_run": run.pk}
    if not params.get("wait", True):
        return output
    try:
        while True:
            run.refresh_from_db()
            if not run.is_active:
                break
            ctx.sleep(CAPACITY_POLL_S)
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
        pool_region = _call(CAPACITY_APPLY, principal=ctx.principal, run=run)
        output["applied_to_pool_region"] = getattr(pool_region, "pk", None)
    return output


def _stop_capacity_run(ctx: RunContext, run: Any) -> None:
    cancel = _service(*CAPACITY_CANCEL)
    if cancel is None:
        return
    with contextlib.suppress(Exception):  # already finished: nothing to stop
        cancel(principal=ctx.principal, run=run)


register(JobKind("capacity_test", "Run a capacity test",
                 "Start a capacity test; optionally wait for it and apply its recommendation.",
                 _capacity_validate, _capacity_execute,
                 available=lambda: _has(CAPACITY_START) and _model("capacity", "CapacityTest") is not None))


# --- cloud -----------------------------------------------------------------------------------


def _cloud_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"target"})
    _visible(_model("cloud", "CloudTarget"), principal, "target", params.get("target"), "cloud target")
    return {"target": params["target"]}


def _cloud_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    target = _resolve_at_run(_model("cloud", "CloudTarget"), ctx, params["target"], "cloud target")
    started = time.monotonic()
    result = _call(CLOUD_APPLY, principal=ctx.principal, target=target)
    elapsed_s = round(time.monotonic() - started, 3)
    return {"target": target.pk, "result": _summary(result), "elapsed_s": elapsed_s}


register(JobKind("cloud_apply", "Apply a cloud target", "Synthesize and apply the target's cloud stack.",
                 _cloud_validate, _cloud_execute, available=lambda: _has(CLOUD_APPLY)))
