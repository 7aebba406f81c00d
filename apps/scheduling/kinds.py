"""Job kinds: what a job does. Each kind validates its params strictly and runs by calling services.

A job runs as its organization (`job_principal`): objects named in params are looked up
with `visible_to` both when the job is saved and again when it runs, so a job can never
act on another tenant's member, pool or test, even if ownership changed in between.

The registry and the param readers are in registry.py; the kinds that drive other apps (fleets, capacity,
cloud) live in kinds_external.py; both modules register their kinds when the scheduling app is ready
(apps.scheduling.apps).
"""

from __future__ import annotations

from typing import Any

from apps.accounts.principal import Principal
from apps.audit.services import AuditAction
from apps.core import webhooks
from apps.scheduling.registry import (
    JobFailed,
    JobKind,
    Param,
    Params,
    RunContext,
    _bad,
    _bool,
    _choice,
    _int,
    _number,
    _only,
    _resolve_at_run,
    _text,
    _visible,
    register,
    url_policy,
)


def _noop_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"sleep_s", "fail", "fail_attempts", "message"})
    return {
        "sleep_s": _number(params, "sleep_s", low=0, high=3600, default=0),
        "fail": _bool(params, "fail"),
        "fail_attempts": _int(params, "fail_attempts", low=0, high=100, default=0),
        "message": _text(params, "message", max_len=200),
    }


def _noop_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    sleep_s = float(params.get("sleep_s", 0))
    if sleep_s:
        ctx.sleep(sleep_s)
    if params.get("fail") or ctx.attempt <= int(params.get("fail_attempts", 0)):
        raise JobFailed(params.get("message") or f"noop asked to fail on attempt {ctx.attempt}")
    return {"slept_s": sleep_s, "attempt": ctx.attempt, "message": params.get("message", "")}


def _http_check_validate(params: Params, principal: Principal) -> Params:
    _only(params, {"url", "expect_status", "timeout_s"})
    url = params.get("url")
    try:
        webhooks.parse_url(url, url_policy(principal.org))
    except webhooks.UnsafeUrl as exc:
        raise _bad("url", exc.message) from None
    return {
        "url": url,
        "expect_status": _int(params, "expect_status", low=100, high=599, default=200),
        "timeout_s": _number(params, "timeout_s", low=0.1, high=webhooks.MAX_TIMEOUT_S, default=5.0),
    }


def _http_check_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    try:
        reply = webhooks.request("GET", params["url"], timeout_s=params.get("timeout_s", 5.0),
                                 policy=url_policy(ctx.principal.org))
    except webhooks.UnsafeUrl as exc:
        raise JobFailed(exc.message) from None
    except OSError as exc:
        raise JobFailed(f"GET {params['url']} failed: {exc}") from None
    result = {"status": reply.status, "latency_ms": round(reply.elapsed_ms, 1), "address": reply.address}
    if reply.status != params.get("expect_status", 200):
        expected = params.get("expect_status", 200)
        raise JobFailed(f"GET {params['url']} answered {reply.status}, expected {expected}")
    return result


register(JobKind("noop", "No-op (test)", "Does nothing; optional sleep_s, fail, fail_attempts.",
                 _noop_validate, _noop_execute, quick=lambda params: float(params.get("sleep_s", 0)) <= 0.05,
                 params=(Param("sleep_s", "Sleep (seconds)", "number", default=0),
                         Param("fail", "Fail every attempt", "bool", default=False),
                         Param("fail_attempts", "Fail the first N attempts", "int", default=0),
                         Param("message", "Message", "text", default=""))))
register(JobKind("http_check", "HTTP check", "GET a URL and expect a status code.",
                 _http_check_validate, _http_check_execute,
                 params=(Param("url", "URL", "url", required=True),
                         Param("expect_status", "Expected status", "int", default=200),
                         Param("timeout_s", "Timeout (seconds)", "number", default=5.0))))


# --- balancers: drain windows and capacity changes ------------------------------------------


def _member_validate(params: Params, principal: Principal) -> Params:
    from apps.balancers.models import Member

    _only(params, {"member", "admin_state", "weight"})
    _visible(Member, principal, "member", params.get("member"), "member")
    cleaned: Params = {
        "member": params["member"],
        "admin_state": _choice(params, "admin_state", list(Member.AdminState.values)),
    }
    if "weight" in params:
        cleaned["weight"] = _int(params, "weight", low=0, high=256)
    return cleaned


def _member_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    from apps.balancers.models import Member
    from apps.balancers.services import member_set_state

    member = _resolve_at_run(Member, ctx, params["member"], "member")
    before = {"admin_state": member.admin_state, "weight": member.weight}
    member_set_state(principal=ctx.principal, member=member, admin_state=params["admin_state"],
                     weight=params.get("weight"))
    return {"member": member.pk, "name": str(member), "before": before,
            "after": {"admin_state": member.admin_state, "weight": member.weight}}


def _scaler_validate(params: Params, principal: Principal) -> Params:
    from apps.balancers.models import PoolRegion

    _only(params, {"pool_region", "capacity_scaler"})
    _visible(PoolRegion, principal, "pool_region", params.get("pool_region"), "pool region")
    scaler = _number(params, "capacity_scaler", low=0, high=1)
    if 0 < scaler < 0.1:
        raise _bad("capacity_scaler", "capacity_scaler must be 0 (no traffic) or between 0.1 and 1.0.")
    return {"pool_region": params["pool_region"], "capacity_scaler": scaler}


def _scaler_execute(ctx: RunContext, params: Params) -> dict[str, Any]:
    from apps.balancers.models import PoolRegion
    from apps.balancers.services import object_save

    pool_region = _resolve_at_run(PoolRegion, ctx, params["pool_region"], "pool region")
    before = pool_region.capacity_scaler
    object_save(principal=ctx.principal, obj=pool_region, action=AuditAction.UPDATE,
                data={"capacity_scaler": params["capacity_scaler"]})
    return {"pool_region": pool_region.pk, "name": str(pool_region), "before": before,
            "after": pool_region.capacity_scaler}


register(JobKind("member_set_state", "Set member state", "Drain window start/end: admin_state (and weight).",
                 _member_validate, _member_execute, quick=lambda params: True,
                 params=(Param("member", "Member", "ref", ref="member", required=True),
                         Param("admin_state", "State", "choice", choices=("active", "drain", "maint"),
                               default="drain", required=True),
                         Param("weight", "Weight (optional)", "int"))))
register(JobKind("pool_capacity_scaler", "Set pool capacity scaler",
                 "Scale a pool's capacity in one region (0, or 0.1 to 1.0).",
                 _scaler_validate, _scaler_execute, quick=lambda params: True,
                 params=(Param("pool_region", "Pool region", "ref", ref="pool_region", required=True),
                         Param("capacity_scaler", "Capacity scaler (0, or 0.1 to 1.0)", "number", default=1.0,
                               required=True))))


