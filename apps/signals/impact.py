"""What a change did: the canary's figures against the other nodes' (the rollout's guard), and any change's
5 minutes before against its 5 minutes after (its page's flag), both judged by the fleet's guards.

A rise is judged only on MIN_REQUESTS or more on each side: a handful of requests says nothing, and a flag a
user learns to ignore is worse than none. 5xx are all of them, the backend's and HAProxy's own (a route sent
to a pool with no server answers 503 from HAProxy: that is the change's effect too).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from apps.audit.models import AuditEvent
from apps.fleets import selectors as fleet_selectors
from apps.fleets.models import Fleet
from apps.fleets.services import (
    CANARY_MIN_P99_REQUESTS,
    CANARY_MIN_REQUESTS,
    CanaryVerdict,
    CanaryWatch,
    canary_judge_register,
)
from apps.signals import hist
from apps.signals.aggregate import ROW_FIELDS, Sums
from apps.signals.models import SignalBucket
from apps.signals.selectors import Target, lb_id_of, target, window
from apps.signals.services import COARSE_STEP_S, FINE_KEEP, FINE_STEP_S

MIN_REQUESTS = CANARY_MIN_REQUESTS
MIN_P99_REQUESTS = CANARY_MIN_P99_REQUESTS
WINDOW = timedelta(minutes=5)
BASELINE = timedelta(minutes=1)  # the canary's own minute before, when the other nodes saw too little
DEFAULT_GUARDS = (Fleet._meta.get_field("guard_5xx_rise_pct").default,
                  Fleet._meta.get_field("guard_p99_rise_ms").default)


@dataclass(frozen=True)
class Side:
    requests: int
    error_pct: float | None  # 5xx share of requests, percent
    p99_ms: float | None

    @classmethod
    def of(cls, sums: Sums) -> Side:
        if not sums.requests:
            return cls(0, None, None)
        return cls(sums.requests, 100.0 * sums.s5xx / sums.requests, hist.percentile(sums.t_total, 0.99))

    def as_dict(self) -> dict[str, Any]:
        return {"requests": self.requests, "error_pct": self.error_pct, "p99_ms": self.p99_ms}


def rises(before: Side, after: Side, max_5xx_rise_pct: float, max_p99_rise_ms: int) -> list[str]:
    """What rose past a guard, in words; [] when nothing did or either side is too thin to judge (p99 needs
    MIN_P99_REQUESTS on each side)."""
    if before.requests < MIN_REQUESTS or after.requests < MIN_REQUESTS:
        return []
    out = []
    rise = (after.error_pct or 0.0) - (before.error_pct or 0.0)
    if rise > max_5xx_rise_pct:
        out.append(f"5xx rose from {before.error_pct:.1f}% to {after.error_pct:.1f}% of requests "
                   f"(+{rise:.1f} points, guard {max_5xx_rise_pct:g})")
    judged_p99 = (bool(max_p99_rise_ms) and before.p99_ms is not None and after.p99_ms is not None
                  and min(before.requests, after.requests) >= MIN_P99_REQUESTS)
    if judged_p99 and after.p99_ms - before.p99_ms > max_p99_rise_ms:  # type: ignore[operator]
        out.append(f"p99 latency rose from {before.p99_ms:.0f} ms to {after.p99_ms:.0f} ms "
                       f"(guard +{max_p99_rise_ms} ms)")
    return out


def _sum(rows) -> Sums:
    total = Sums()
    for row in rows.values_list(*ROW_FIELDS):
        total.add_row(row)
    return total


def canary_judge(watch: CanaryWatch) -> CanaryVerdict | None:
    """The canary's requests since it took the revision against the other nodes' over the same buckets."""
    # The first whole bucket after the canary took the revision: the one it took it in holds requests the
    # revision before answered (the canary's own earlier trouble, when the last rollout was refused).
    since = datetime.fromtimestamp(-(-int(watch.since.timestamp()) // FINE_STEP_S) * FINE_STEP_S, UTC)
    listeners = SignalBucket.objects.filter(kind=SignalBucket.Kind.LISTENER, step_s=FINE_STEP_S)
    if watch.lb_ids:  # the changed LBs' traffic alone: a broken small LB is not diluted by the node's others
        listeners = listeners.filter(lb_id__in=watch.lb_ids)
    canary = _sum(listeners.filter(node=watch.canary, start__gte=since))
    if canary.requests < MIN_REQUESTS:
        return None
    others = _sum(listeners.filter(node__in=watch.others, start__gte=since)) if watch.others else Sums()
    against = "the other nodes"
    if others.requests < MIN_REQUESTS:
        others = _sum(listeners.filter(node=watch.canary, start__gte=since - BASELINE, start__lt=since))
        against = "its own minute before"
    before, after = Side.of(others), Side.of(canary)
    figures = {"canary_requests": after.requests, "canary_error_pct": after.error_pct or 0.0,
               "baseline_requests": before.requests, "baseline_error_pct": before.error_pct or 0.0,
               "canary_p99_ms": after.p99_ms or 0.0, "baseline_p99_ms": before.p99_ms or 0.0}
    if before.requests < MIN_REQUESTS:  # nothing to compare with: 5xx judged against the guard alone, p99 not
        before = Side(MIN_REQUESTS, 0.0, None)
        against = "no baseline (p99 not judged)"
    found = rises(before, after, watch.max_5xx_rise_pct, watch.max_p99_rise_ms)
    if found:
        return CanaryVerdict(True, f"{'; '.join(found)} against {against}", figures)
    return CanaryVerdict(False, f"{after.requests} requests, {after.error_pct:.1f}% 5xx against {against}'s "
                                f"{before.error_pct or 0.0:.1f}%", figures)


def register() -> None:
    canary_judge_register(canary_judge)


# --- a change's page ---------------------------------------------------------------------------------

# What a change's chart shows: the object it changed, or what holds it (a member's pool, a listener's LB).
CHART_OF = {"route": "route", "pool": "pool", "member": "member", "poolregion": "pool", "listener": "lb",
            "loadbalancer": "lb"}


def change_target(principal: Any, event: AuditEvent) -> Target | None:
    scope = CHART_OF.get(event.object_type)
    if scope is None or not event.object_id.isdigit():
        return None
    pk = int(event.object_id)
    if event.object_type == "poolregion":
        from apps.balancers.models import PoolRegion

        pk = PoolRegion.objects.filter(pk=pk).values_list("pool_id", flat=True).first() or 0
    elif event.object_type == "listener":
        from apps.balancers.models import Listener

        pk = Listener.objects.filter(pk=pk).values_list("lb_id", flat=True).first() or 0
    return target(principal, scope, pk)


def guards_for(lb_id: int | None) -> tuple[float, int]:
    """The strictest guards of the fleets serving the LB (the operator's settings); the defaults without one."""
    fleets = list(Fleet.objects.filter(pk__in=fleet_selectors.fleet_ids_for_lb(lb_id))
                  .values_list("guard_5xx_rise_pct", "guard_p99_rise_ms")) if lb_id else []
    if not fleets:
        return DEFAULT_GUARDS
    p99_guards = [ms for _, ms in fleets if ms]
    return min(pct for pct, _ in fleets), min(p99_guards) if p99_guards else 0


def change_impact(t: Target, at: datetime, lb_id: int | None, *, now: datetime | None = None) -> dict[str, Any]:
    """The target's 5 minutes before `at` against the 5 minutes after (or the minutes so far), the flag, and the
    chart of those 10 minutes."""
    now = now or datetime.now(UTC)
    step = FINE_STEP_S if now - at < FINE_KEEP - WINDOW else COARSE_STEP_S
    rows = t.rows.filter(step_s=step)
    edge = datetime.fromtimestamp(int(at.timestamp()) // step * step, UTC)
    # A coarse bucket holding the change is half before, half after: left out, the sides are true to their names.
    after_from = edge if step == FINE_STEP_S else edge + timedelta(seconds=step)
    before = Side.of(_sum(rows.filter(start__gte=edge - WINDOW, start__lt=edge)))
    after = Side.of(_sum(rows.filter(start__gte=after_from, start__lt=after_from + WINDOW)))
    max_pct, max_ms = guards_for(lb_id)
    found = rises(before, after, max_pct, max_ms)
    first = int((edge - WINDOW).timestamp())
    point = step if step == COARSE_STEP_S else 10
    chart = window(t, first, first + 2 * int(WINDOW.total_seconds()), step, point, now=now.timestamp())
    return {
        "before": before.as_dict(), "after": after.as_dict(),
        "after_complete": now >= at + WINDOW, "step_s": step,
        "guards": {"max_5xx_rise_pct": max_pct, "max_p99_rise_ms": max_ms},
        "flagged": bool(found), "reasons": found,
        "judged": before.requests >= MIN_REQUESTS and after.requests >= MIN_REQUESTS,
        "chart": chart,
    }


def change_payload(principal: Any, event_id: int, *, now: datetime | None = None) -> dict[str, Any] | None:
    """A change's page: who did what, and its effect on the chart of what it changed. None: no such change for
    this principal (another tenant's change reads as a missing one)."""
    event = AuditEvent.objects.visible_to(principal).filter(pk=event_id).first()
    if event is None:
        return None
    change = {"id": event.pk, "at": event.at.timestamp(), "who": event.who, "action": event.action,
              "object_type": event.object_type, "object_id": event.object_id, "object": event.object_label}
    t = change_target(principal, event)
    if t is None:
        return {"change": change, "scope": None, "impact": None,
                "note": "Nothing charted: the object is gone, or its traffic is not one the signals count."}
    impact = change_impact(t, event.at, lb_id_of(t), now=now)
    impact["chart"]["markers"] = [{"t": event.at.timestamp(), "kind": "change",
                                   "label": f"{event.who}: {event.action} {event.object_label}"}]
    return {"change": change, "scope": t.scope, "target_id": t.obj.pk, "target": str(t.obj), "impact": impact}
