"""Per-org quotas: how much of the shared control plane one tenant may take.

Two kinds, each with a default from settings (QUOTA_<NAME>) that an operator can change per org
(`Organization.quotas`, through `/api/v1/organizations/{id}/` or the org's quotas page):

- counts (`check_count`): rows an org may hold at once — static IPs from shared pools, event
  subscriptions, hostname claims, load balancers, routes, pending invitations. Past the limit a create
  answers 409 `quota_exceeded`, naming the limit and what the org holds;
- rates (`check_rate`): actions per window — certificate renewals asked for by hand, test sends of a
  subscription. Past the limit the action answers 429 `rate_limited` with Retry-After. Counted in the
  cache (Redis in production), in fixed windows: a burst at a window's edge can reach twice the rate,
  which is a bound, not an accounting. Writes (`check_write_rate`: route changes per minute, so one busy
  tenant cannot fill the shared LB's write lock and the rollout queues) count when their transaction
  commits: a refused write, or a preview that is rolled back, is not a change.

Operators' own org is not limited (it runs the platform). The app that owns what a count counts registers
its counter (`count_with`, from its AppConfig.ready), so this module reads no other app's models; the page
and the API show each quota with its use (`usage`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from django.conf import settings
from django.core.cache import cache
from django.db import transaction

from apps.core.errors import REDIS_ERRORS, DomainError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Quota:
    name: str
    label: str  # "static IPs from shared pools"
    default: int
    window_s: int = 0  # 0: a count of rows held; else actions per this many seconds

    @property
    def is_rate(self) -> bool:
        return self.window_s > 0


QUOTAS: Final[dict[str, Quota]] = {q.name: q for q in (
    Quota("static_ips", "static IPs from shared pools", 16),
    Quota("event_subscriptions", "event subscriptions", 20),
    Quota("hostname_claims", "hostname claims", 200),
    Quota("load_balancers", "load balancers", 50),
    Quota("routes", "routes", 20_000),
    Quota("invitations", "invitations waiting for an answer", 100),
    Quota("renewals_per_hour", "certificate renewals asked for per hour", 10, window_s=3600),
    Quota("test_sends_per_hour", "test events sent per hour", 30, window_s=3600),
    # 100 a second: six times bench-scale's sustained 1,000 a minute on one LB (issue 40 asks 6,000 a minute).
    Quota("route_changes_per_minute", "route changes per minute", 6_000, window_s=60),
)}


COUNTERS: dict[str, Callable[[Any], int]] = {}


def count_with(name: str, counter: Callable[[Any], int]) -> None:
    """Register how many rows of quota `name` an org holds (called by the app that owns the rows)."""
    if name not in QUOTAS:
        raise KeyError(name)
    COUNTERS[name] = counter


class QuotaExceeded(DomainError):
    pass


def limit(org: Any, name: str) -> int | None:
    """The org's limit for `name` (None: unlimited, the operator org)."""
    if org.is_operator:
        return None
    quota = QUOTAS[name]
    override = (getattr(org, "quotas", None) or {}).get(name)
    if isinstance(override, int) and not isinstance(override, bool):
        return override
    return int(getattr(settings, f"QUOTA_{name.upper()}", quota.default))


def check_count(org: Any, name: str, adding: int = 1) -> None:
    """Refuse (409 quota_exceeded) a create that would take the org past its count `name`."""
    cap = limit(org, name)
    if cap is None:
        return
    used = COUNTERS[name](org)
    if used + adding > cap:
        quota = QUOTAS[name]
        raise QuotaExceeded("quota_exceeded", f"{org.slug} may hold at most {cap} {quota.label} and holds {used}. "
                            "Remove some, or ask your operator to raise the quota.", status=409)


def check_rate(org: Any, name: str, *, scope: str = "") -> None:
    """Count one action against the org's rate `name`; refuse (429 rate_limited) past it."""
    cap = limit(org, name)
    if cap is None:
        return
    quota = QUOTAS[name]
    window = int(time.time() // quota.window_s)
    if _count(_key(name, org.pk, scope, window), quota) > cap:
        raise _refused(org, cap, quota, window)


def check_write_rate(org: Any, name: str) -> None:
    """Refuse (429 rate_limited) a write of an org already at its rate `name`; count the write when the
    transaction it runs in commits (at once outside one)."""
    cap = limit(org, name)
    if cap is None:
        return
    quota = QUOTAS[name]
    window = int(time.time() // quota.window_s)
    key = _key(name, org.pk, "", window)
    try:
        used = cache.get(key) or 0
    except REDIS_ERRORS:  # a quota never stops writes while the cache is out of reach: they go uncounted
        log.warning("quota %s of org %s not checked: the cache is out of reach", name, org.pk)
        return
    if used >= cap:
        raise _refused(org, cap, quota, window)
    transaction.on_commit(lambda: _count_after_commit(key, quota))


def _count_after_commit(key: str, quota: Quota) -> None:
    """After the commit the write is done: a cache gone meanwhile must not turn it into an error answer."""
    try:
        _count(key, quota)
    except REDIS_ERRORS:
        log.warning("quota key %s not counted: the cache is out of reach", key)


def _key(name: str, org_id: int, scope: str, window: int) -> str:
    return f"quota:{name}:{org_id}:{scope}:{window}"


def _count(key: str, quota: Quota) -> int:
    cache.add(key, 0, timeout=quota.window_s + 60)
    try:
        return cache.incr(key)
    except ValueError:  # evicted between add and incr
        cache.set(key, 1, timeout=quota.window_s + 60)
        return 1


def _refused(org: Any, cap: int, quota: Quota, window: int) -> QuotaExceeded:
    retry_after = int((window + 1) * quota.window_s - time.time()) + 1
    return QuotaExceeded("rate_limited", f"{org.slug} may make at most {cap} {quota.label}; try again in "
                         f"{_duration(retry_after)}.", status=429, retry_after_s=retry_after)


def usage(org: Any) -> list[dict[str, Any]]:
    """Each quota with the org's limit and current use (counts from their owners, rates from the cache)."""
    rows = []
    for quota in QUOTAS.values():
        if quota.is_rate:
            window = int(time.time() // quota.window_s)
            used = cache.get(_key(quota.name, org.pk, "", window)) or 0
        else:
            used = COUNTERS[quota.name](org) if quota.name in COUNTERS else 0
        rows.append({"name": quota.name, "label": quota.label, "limit": limit(org, quota.name), "used": used,
                     "per_s": quota.window_s or None})
    return rows


def validate_overrides(value: Any) -> dict[str, int]:
    """An operator's quota overrides: known names, whole numbers from 0 to 1,000,000."""
    if not isinstance(value, dict):
        raise ValueError("quotas must be an object of {name: whole number}.")
    unknown = sorted(set(value) - set(QUOTAS))
    if unknown:
        raise ValueError(f"Unknown quota(s): {', '.join(unknown)}; known: {', '.join(QUOTAS)}.")
    for name, number in value.items():
        if isinstance(number, bool) or not isinstance(number, int) or not 0 <= number <= 1_000_000:
            raise ValueError(f"{name} must be a whole number from 0 to 1,000,000.")
    return dict(value)


def _duration(seconds: int) -> str:
    return f"{seconds // 60} min" if seconds >= 120 else f"{seconds} s"
