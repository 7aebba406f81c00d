"""Job kinds: what a job does. Each kind validates its params strictly and runs by calling services.

A job runs as its organization (`job_principal`): objects named in params are looked up
with `visible_to` both when the job is saved and again when it runs, so a job can never
act on another tenant's member, pool or test, even if ownership changed in between.

The kinds that drive other apps (fleets, capacity, cloud) live in kinds_external.py; both modules
register their kinds when the scheduling app is ready (apps.scheduling.apps).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apps.accounts.models import Role
from apps.accounts.principal import Principal
from apps.audit.services import AuditAction
from apps.core import webhooks
from apps.core.errors import DomainError

Params = dict[str, Any]


class JobFailed(Exception):
    """A run failed for a reason a person can act on (shown as the run's error)."""


class RunCancelled(Exception):
    """The run was cancelled (replaced or cancelled by a user) while it ran."""


@dataclass(frozen=True)
class JobPrincipal(Principal):
    """The identity a job acts with: its org, editor rights, audited as `job:<id>`."""

    job_id: int | None = None

    @property
    def actor(self) -> str:
        return f"job:{self.job_id}"

    @property
    def name(self) -> str:  # type: ignore[override]
        return f"job {self.job_id}"


def job_principal(job) -> JobPrincipal:
    return JobPrincipal(org=job.org, role=Role.EDITOR, job_id=job.pk)


def creator_authority_lapsed(job) -> str | None:
    """Why the job's creator (`created_by`, a token or a user) could no longer make it, or None.

    A job acts with editor rights long after the request that made it; it must not outlive that
    authority: a revoked or expired token (a short-lived CI token, say), or a user who left the org,
    was deactivated or is no longer an editor there, ends its runs. Jobs from before `created_by` was
    kept (blank) are not judged."""
    from django.contrib.auth import get_user_model
    from django.db.models import Q

    from apps.accounts.models import ROLE_RANK, ApiToken, Membership, Organization

    kind, _, ident = job.created_by.partition(":")
    if not ident.isdigit():
        return None
    user_id = int(ident) if kind == "user" else None
    if kind == "token":
        token = ApiToken.objects.filter(pk=int(ident)).first()
        if token is None or not ApiToken.objects.filter(pk=token.pk).usable().exists():
            return "the API token that created this job was revoked or has expired"
        user_id = token.user_id
    if user_id is not None:  # the user behind the token too: still active, still an editor of the org
        user = get_user_model().objects.filter(pk=user_id, is_active=True).first()
        # Its own org's editor, or an operator's (operators act on every org).
        roles = Membership.objects.filter(
            Q(org_id=job.org_id) | Q(org__kind=Organization.Kind.OPERATOR), user=user).values_list("role", flat=True)
        if user is None or not any(ROLE_RANK[Role(r)] >= ROLE_RANK[Role.EDITOR] for r in roles):
            return "the user who created this job is no longer an editor of its organization"
    return None


url_policy = webhooks.org_policy  # one rule for every outbound URL a tenant types (jobs, events)


@dataclass
class RunContext:
    run_id: int
    job_id: int
    attempt: int
    scheduled_for: datetime
    principal: Principal
    cancel_event: threading.Event = field(default_factory=threading.Event)
    cancel_reason: str = ""  # "timeout" or "cancelled", set by whoever sets cancel_event

    def sleep(self, seconds: float) -> None:
        """Sleep, but wake up and stop as soon as the run is cancelled."""
        if self.cancel_event.wait(max(0.0, seconds)):
            raise RunCancelled("the run was cancelled")


@dataclass(frozen=True)
class JobKind:
    name: str
    label: str
    help: str
    validate: Callable[[Params, Principal], Params]
    execute: Callable[[RunContext, Params], dict[str, Any]]
    operator_only: bool = False
    # Quick runs (milliseconds: a state flip) may share a message with others; see runner.CHUNK_SIZE.
    quick: Callable[[Params], bool] = lambda params: False


REGISTRY: dict[str, JobKind] = {}


def register(kind: JobKind) -> JobKind:
    REGISTRY[kind.name] = kind
    return kind


def get_kind(name: str) -> JobKind:
    kind = REGISTRY.get(name)
    if kind is None:
        names = ", ".join(sorted(REGISTRY))
        raise DomainError("unknown_kind", f"Unknown job kind {name!r}; use one of {names}.", field="kind")
    return kind


def validate_params(kind_name: str, params: object, principal: Principal) -> Params:
    """Cleaned params for `kind_name`, or DomainError naming the bad field."""
    kind = get_kind(kind_name)
    if kind.operator_only and not principal.is_operator:
        raise DomainError("operator_only", f"Only the operator organization can schedule {kind.name} jobs.",
                          field="kind", status=403)
    if not isinstance(params, dict):
        raise DomainError("invalid_params", "params must be a JSON object.", field="params")
    return kind.validate(params, principal)


def is_quick(kind_name: str, params: Params) -> bool:
    kind = REGISTRY.get(kind_name)
    try:
        return bool(kind and kind.quick(params))
    except Exception:
        return False


def kind_choices() -> list[tuple[str, str]]:
    return [(k.name, k.label) for k in sorted(REGISTRY.values(), key=lambda k: k.name)]


# --- strict param readers -------------------------------------------------------------------


def _bad(key: str, message: str) -> DomainError:
    return DomainError("invalid_params", message, field=f"params.{key}")


def _only(params: Params, allowed: set[str]) -> None:
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise _bad(unknown[0], f"Unknown parameter {unknown[0]!r}; allowed: {', '.join(sorted(allowed))}.")


def _int(params: Params, key: str, *, low: int, high: int, default: int | None = None) -> int:
    value = params.get(key, default)
    if value is None:
        raise _bad(key, f"{key} is required.")
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(key, f"{key} must be a whole number.")
    if not low <= value <= high:
        raise _bad(key, f"{key} must be between {low} and {high}.")
    return value


def _number(params: Params, key: str, *, low: float, high: float, default: float | None = None) -> float:
    value = params.get(key, default)
    if value is None:
        raise _bad(key, f"{key} is required.")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(key, f"{key} must be a number.")
    if not low <= value <= high:
        raise _bad(key, f"{key} must be between {low} and {high}.")
    return float(value)


def _bool(params: Params, key: str, default: bool = False) -> bool:
    value = params.get(key, default)
    if not isinstance(value, bool):
        raise _bad(key, f"{key} must be true or false.")
    return value


def _choice(params: Params, key: str, choices: list[str], default: str | None = None) -> str:
    value = params.get(key, default)
    if value not in choices:
        raise _bad(key, f"{key} must be one of {', '.join(choices)}.")
    return value


def _text(params: Params, key: str, *, max_len: int, default: str = "") -> str:
    value = params.get(key, default)
    if not isinstance(value, str) or len(value) > max_len or any(ord(c) < 0x20 for c in value):
        raise _bad(key, f"{key} must be text of at most {max_len} characters without control characters.")
    return value


def _visible(model, principal: Principal, key: str, pk: object, what: str):
    if isinstance(pk, bool) or not isinstance(pk, int):
        raise _bad(key, f"{key} must be the id of a {what}.")
    obj = model.objects.visible_to(principal).filter(pk=pk).first()
    if obj is None:
        # Same answer for missing and foreign: never confirm another tenant's ids.
        raise _bad(key, f"{what} {pk} not found.")
    return obj


def _resolve_at_run(model, ctx: RunContext, pk: int, what: str):
    obj = model.objects.visible_to(ctx.principal).filter(pk=pk).first()
    if obj is None:
        raise JobFailed(f"{what} {pk} no longer exists or is no longer visible to this job's organization.")
    return obj


# --- noop and http_check (also what the fault tests use) -----------------------------------


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
                 _noop_validate, _noop_execute, quick=lambda params: float(params.get("sleep_s", 0)) <= 0.05))
register(JobKind("http_check", "HTTP check", "GET a URL and expect a status code.",
                 _http_check_validate, _http_check_execute))


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
                 _member_validate, _member_execute, quick=lambda params: True))
register(JobKind("pool_capacity_scaler", "Set pool capacity scaler",
                 "Scale a pool's capacity in one region (0, or 0.1 to 1.0).",
                 _scaler_validate, _scaler_execute, quick=lambda params: True))


