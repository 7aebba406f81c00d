"""The job-kind registry and what every kind is built from: a kind is a validate and an execute function
registered under its name (`register`); the runner looks kinds up here, never in the modules that define them.

A job runs as its organization (`job_principal`) and on its creator's authority (`creator_authority_lapsed`);
the strict param readers (`_int`, `_text`, `_visible`, ...) answer a bad param with a DomainError naming it.
The kinds themselves live in kinds.py (built-in) and kinds_external.py (fleets, capacity, cloud).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from apps.accounts.models import Role
from apps.accounts.principal import Principal
from apps.core import webhooks
from apps.core.errors import DomainError
from apps.scheduling.params import Param, resolve_names, to_names

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
    # What the parameters are (apps.scheduling.params): the form's fields, and references by name.
    params: tuple[Param, ...] = ()


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
    return kind.validate(resolve_names(params, kind.params, principal), principal)


def params_for_export(kind_name: str, params: Params) -> Params:
    """A job's params with references as names (no ids), as a config document holds them."""
    kind = REGISTRY.get(kind_name)
    return to_names(params, kind.params) if kind is not None else dict(params)


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
        raise _bad(key, f"{key} must be a {what}: its name, or its id.")
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
