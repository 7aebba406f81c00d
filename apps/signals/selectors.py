"""Reads of golden signals: chart series for an LB, route, pool, member or node, and change markers."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.db.models import CharField, Q, QuerySet
from django.db.models.functions import Cast

from apps.audit.models import AuditEvent
from apps.balancers.models import Listener, LoadBalancer, Member, Pool, PoolRegion, Region, Route
from apps.events.models import Event
from apps.fleets import selectors as fleet_selectors
from apps.fleets.models import Node, Rollout
from apps.signals import hist
from apps.signals.aggregate import ALL_NODES, HIST_FIELDS, ROW_FIELDS, Sums
from apps.signals.models import RequestSample, SignalBucket
from apps.signals.services import COARSE_STEP_S, FINE_STEP_S
from apps.traffic.models import TrafficSample

# range name -> (span s, stored step s, point s): about 60-340 points a chart, whatever the range.
RANGES: dict[str, tuple[int, int, int]] = {
    "5m": (300, FINE_STEP_S, FINE_STEP_S),
    "1h": (3600, FINE_STEP_S, 30),
    "24h": (86400, COARSE_STEP_S, COARSE_STEP_S),
    "7d": (7 * 86400, COARSE_STEP_S, 1800),
}
SCOPES = ("lb", "route", "pool", "member", "node", "region")
QUANTILES = (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))
MAX_MARKERS = 200
Kind = SignalBucket.Kind


class UnknownRange(ValueError):
    pass


@dataclass(frozen=True)
class Target:
    """What a chart shows: a scope, the object and the rows that sum to it."""

    scope: str
    obj: Any
    rows: QuerySet[SignalBucket]
    # The nodes' own count of open sessions (traffic.TrafficSample, from `show stat` scur): for LB and pool
    # charts, the pools whose samples sum to it; None where stats do not split that way (routes, members).
    sessions: QuerySet[TrafficSample] | None = None


def target(principal: Any, scope: str, pk: int | str) -> Target | None:
    """The rows behind a chart, through the principal's scoped querysets; None: no such object for them
    (another tenant's object answers exactly as a missing one). On a shared LB a tenant's LB chart is the
    sum of its own routes there: the other tenants' traffic and the LB's total stay out of it."""
    rows = SignalBucket.objects.visible_to(principal)
    if scope == "lb":
        lb = LoadBalancer.objects.visible_to(principal).filter(pk=pk).first()
        if lb is None:
            return None
        # Sessions of the principal's own pools there (a tenant's on a shared LB, every pool for its owner).
        sessions = TrafficSample.objects.visible_to(principal).filter(pool__lb=lb)
        # A shared LB's totals are everyone's: its owner sees them only when it is the operator.
        if principal.is_operator or (lb.org_id == principal.org_id and not lb.shared):
            return Target(scope, lb, rows.filter(kind=Kind.LISTENER, lb_id=lb.pk, node=ALL_NODES), sessions)
        return Target(scope, lb, rows.filter(kind=Kind.ROUTE, lb_id=lb.pk), sessions)
    if scope == "route":
        route = Route.objects.visible_to(principal).filter(pk=pk).first()
        return None if route is None else Target(scope, route, rows.filter(kind=Kind.ROUTE, ref_id=route.pk))
    if scope == "pool":
        pool = Pool.objects.visible_to(principal).filter(pk=pk).first()
        if pool is None:
            return None
        return Target(scope, pool, rows.filter(kind=Kind.MEMBER, pool_id=pool.pk, node=ALL_NODES),
                      TrafficSample.objects.filter(pool=pool))
    if scope == "member":
        member = Member.objects.visible_to(principal).filter(pk=pk).first()
        return None if member is None else Target(scope, member, rows.filter(kind=Kind.MEMBER, ref_id=member.pk,
                                                                             node=ALL_NODES))
    if scope == "region":
        # What arrived at the region's nodes: the listeners the principal's LBs have there, per node, summed.
        region = Region.objects.filter(pk=pk).first()
        if region is None:
            return None
        return Target(scope, region, rows.filter(kind=Kind.LISTENER, region=region.slug))  # per-node rows only
    if scope == "node" and principal.is_operator:
        node = Node.objects.select_related("fleet").filter(pk=pk).first()
        if node is None:
            return None
        return Target(scope, node, rows.filter(kind=Kind.LISTENER, node=str(node)))
    return None


def _summary(sums: Sums, seconds: float) -> dict[str, Any]:
    requests = sums.requests
    out: dict[str, Any] = {
        "requests": requests,
        "rate": requests / seconds,
        **{f"rate_{c}": getattr(sums, f"s{c}") / seconds for c in ("1xx", "2xx", "3xx", "4xx", "5xx")},
        "rate_proxy_5xx": sums.proxy_5xx / seconds,
        "rate_backend_5xx": (sums.s5xx - sums.proxy_5xx) / seconds,
        "error_ratio": sums.s5xx / requests if requests else None,
        "error_pct": 100.0 * sums.s5xx / requests if requests else None,
        "retries": sums.retries,
        "redispatches": sums.redispatches,
        "bytes_per_s": sums.bytes / seconds,
    }
    for field in HIST_FIELDS:
        name = field[2:]
        for label, q in QUANTILES:
            out[f"{name}_{label}_ms"] = hist.percentile(getattr(sums, field), q)
    return out


def series(t: Target, range_name: str = "5m", *, now: float | None = None,
           by_ref: dict[int, Sums] | None = None) -> dict[str, Any]:
    """The chart of the last `range_name`: see window()."""
    if range_name not in RANGES:
        raise UnknownRange(f"range must be one of {', '.join(RANGES)}")
    span, step, point = RANGES[range_name]
    now = time.time() if now is None else now
    end = int(now) // point * point + point
    # Coarse rows exist for windows the roll-up has closed (a minute or so after each): the newest minutes come
    # from the fine rows, or every 24h/7d chart ended in a drop that never happened.
    fine_from = (int(now) // COARSE_STEP_S - 1) * COARSE_STEP_S if step == COARSE_STEP_S else None
    return {**window(t, end - span, end, step, point, now=now, by_ref=by_ref, fine_from=fine_from),
            "range": range_name}


def window(t: Target, start: int, end: int, step: int, point: int, *, now: float,
           by_ref: dict[int, Sums] | None = None, fine_from: int | None = None) -> dict[str, Any]:
    """Points of the chart from `start` to `end` (unix s, oldest first, `point` s apart, zeros where nothing came)
    read from rows of `step` s, and the window's totals. `by_ref`: filled with each series' sums over the window,
    from the same rows (a pool's members)."""
    split = min(end, fine_from) if fine_from is not None else end
    parts = [t.rows.filter(step_s=step, start__gte=datetime.fromtimestamp(start, UTC),
                           start__lt=datetime.fromtimestamp(split, UTC))]
    if split < end:
        parts.append(t.rows.filter(step_s=FINE_STEP_S, start__gte=datetime.fromtimestamp(max(start, split), UTC),
                                   start__lt=datetime.fromtimestamp(end, UTC)))
    n = (end - start) // point
    sums = [Sums() for _ in range(n)]
    for row in (r for part in parts for r in part.values_list("start", "ref_id", *ROW_FIELDS).iterator(2000)):
        i = (int(row[0].timestamp()) - start) // point
        if 0 <= i < n:
            values = row[2:]
            sums[i].add_row(values)
            if by_ref is not None:
                by_ref.setdefault(row[1], Sums()).add_row(values)
    total = Sums()
    for each in sums:
        if each.requests:
            total.merge(each)
    sessions = _sessions(t, start, end, point) if step == FINE_STEP_S else None
    # A point still filling (the newest): its rate is over the seconds it has had, not the whole point.
    points = [_summary(sums[i], max(1.0, min(point, now - (start + i * point)))) for i in range(n)]
    keys = [k for k in points[0] if k != "requests"] if points else []
    series = {k: [p[k] for p in points] for k in keys}
    totals = _summary(total, max(1.0, min(end - start, now - start)))
    if sessions is not None:
        series["sessions"] = sessions
        totals["sessions_now"] = next((v for v in reversed(sessions) if v is not None), None)
    return {
        "scope": t.scope, "id": t.obj.pk, "point_s": point,
        "time": [start + i * point for i in range(n)],
        "series": series,
        "requests": [p["requests"] for p in points],
        "totals": totals,
    }


def _sessions(t: Target, start: int, end: int, point: int) -> list[float | None] | None:
    """Open sessions per point: the sum over nodes and pools of each one's latest reading in the point; None
    where no collection happened (fine ranges only: samples are kept hours, not days)."""
    if t.sessions is None:
        return None
    n = (end - start) // point
    # Each node's latest reading of each pool in the point, summed: fleets collect at their own moments, so
    # readings of one instant cannot be matched by time.
    latest: list[dict[tuple[str, int], tuple[float, int]]] = [{} for _ in range(n)]
    for at, node, pool_id, count in t.sessions.filter(
            time__gte=datetime.fromtimestamp(start, UTC), time__lt=datetime.fromtimestamp(end, UTC)).values_list(
            "time", "node", "pool_id", "sessions"):
        i = int(at.timestamp() - start) // point
        if 0 <= i < n and latest[i].get((node, pool_id), (-1.0, 0))[0] < at.timestamp():
            latest[i][(node, pool_id)] = (at.timestamp(), count)
    return [sum(c for _, c in p.values()) if p else None for p in latest]


def by_member(pool: Pool, range_name: str, sums: dict[int, Sums]) -> list[dict]:
    """Each member of a pool over the window (sums from series(by_ref=...)): where the requests, errors and
    latency went."""
    span = RANGES[range_name][0]
    out = []
    for member in pool.members.select_related("region").order_by("region__slug", "name"):
        found = sums.get(member.pk)
        summary = _summary(found, span) if found else None
        out.append({"id": member.pk, "name": member.name, "region": member.region.slug, "signals": summary})
    return out


def markers(t: Target, principal: Any, range_name: str = "5m", *, now: float | None = None) -> list[dict]:
    """Changes that can have moved this chart, newest last: who did what, from the audit log (and, for
    operators, the fleets' rollouts). A change to the object itself, to its routes, pools or members."""
    span = RANGES[range_name][0]
    now = time.time() if now is None else now
    since = datetime.fromtimestamp(now - span, UTC)
    lb_id = lb_id_of(t)
    # Filtered to this chart's objects in the database: taking the newest events of every object first lost an
    # LB's own changes from its longer charts on an install making a thousand changes a minute.
    events = (AuditEvent.objects.visible_to(principal).filter(at__gte=since).filter(_affecting(t, lb_id))
              .order_by("-at")[:MAX_MARKERS])
    out = [{"t": e.at.timestamp(), "kind": "change", "label": f"{e.who}: {e.action} {e.object_repr}",
            "action": e.action, "object_type": e.object_type, "object_id": e.object_id, "change_id": e.pk}
           for e in events]
    if principal.is_operator and lb_id is not None:
        fleets = list(fleet_selectors.fleet_ids_for_lb(lb_id))
        # Drift found and repaired on a node serving it (a live repair is no rollout, and moves traffic too).
        node_ids = [str(pk) for pk in Node.objects.filter(fleet__in=fleets).values_list("pk", flat=True)]
        for e in (Event.objects.filter(at__gte=since, type__in=("drift.found", "drift.repaired"), object_type="node",
                                       object_id__in=node_ids).order_by("-at")[:MAX_MARKERS]):
            out.append({"t": e.at.timestamp(), "kind": "drift", "label": f"system: {e.type} on {e.object_repr}",
                        "action": e.type, "object_type": "node", "object_id": e.object_id})
        for r in (Rollout.objects.filter(created_at__gte=since, fleet__in=fleets)
                  .select_related("fleet", "revision").order_by("-created_at")[:MAX_MARKERS]):
            out.append({"t": r.created_at.timestamp(), "kind": r.kind,
                        "label": f"{r.actor}: {r.kind} of {r.fleet.name} to revision {r.revision.number} ({r.status})",
                        "action": f"rollout.{r.kind}", "object_type": "rollout", "object_id": str(r.pk)})
    return sorted(out, key=lambda m: m["t"])[-MAX_MARKERS:]


def lb_id_of(t: Target) -> int | None:
    """The LB a chart belongs to; None for a node's or a region's."""
    obj = t.obj
    if t.scope == "lb":
        return obj.pk
    if t.scope in ("route", "pool"):
        return obj.lb_id
    if t.scope == "member":
        return obj.pool.lb_id
    return None


def _ids(rows: QuerySet) -> QuerySet:
    """A queryset's primary keys as text, for AuditEvent.object_id (a subquery: no id list in Python)."""
    return rows.annotate(text_id=Cast("pk", output_field=CharField())).values("text_id")


def _affecting(t: Target, lb_id: int | None) -> Q:
    """The audit events whose object can move this chart: the object itself, its pools (a route's targets, an
    LB's pools), their members and capacity (pool regions), an LB's routes and listeners."""
    if t.scope == "route":
        pools = Pool.objects.filter(pk__in=t.obj.targets.values("pool_id"))
        q = Q(object_type="route", object_id=str(t.obj.pk))
    elif t.scope in ("pool", "member"):
        pools = Pool.objects.filter(pk=t.obj.pk if t.scope == "pool" else t.obj.pool_id)
        q = Q()
    elif lb_id is not None:
        pools = Pool.objects.filter(lb_id=lb_id)
        q = (Q(object_type="loadbalancer", object_id=str(lb_id))
             | Q(object_type="route", object_id__in=_ids(Route.objects.filter(lb_id=lb_id)))
             | Q(object_type="listener", object_id__in=_ids(Listener.objects.filter(lb_id=lb_id))))
    else:
        return Q(pk__in=[])  # a node's or a region's chart: the operator's rollout and drift markers only
    q |= Q(object_type="pool", object_id__in=_ids(pools))
    if t.scope == "member":
        q |= Q(object_type="member", object_id=str(t.obj.pk))
    else:
        q |= Q(object_type="member", object_id__in=_ids(Member.objects.filter(pool__in=pools)))
    # Capacity (a pool's region: members' max rate, scaler) moves what the pool can serve.
    return q | Q(object_type="poolregion", object_id__in=_ids(PoolRegion.objects.filter(pool__in=pools)))


# --- sampled requests -----------------------------------------------------------------------------------------

SAMPLE_LIMIT_MAX = 200
_SAMPLE_ROWS = {"lb": "lb_id", "route": "route_id", "pool": "pool_id", "member": "member_id"}


class BadFilter(ValueError):
    def __init__(self, code: str, message: str, field: str) -> None:
        super().__init__(message)
        self.code, self.field = code, field


def sampled_requests(principal: Any, scope: str, pk: int, *, status: str = "", region: str = "", node: str = "",
                     since: float | None = None, until: float | None = None, limit: int = 50) -> list[dict] | None:
    """The sampled requests behind a chart, newest first; None: no such object for this principal. A tenant
    sees its own routes' requests only (on a shared LB too) and the node's region, never its name."""
    t = target(principal, scope, pk)
    if t is None:
        return None
    rows = RequestSample.objects.visible_to(principal)
    if scope in ("node", "region"):
        rows = rows.filter(node=str(t.obj)) if scope == "node" else rows.filter(region=t.obj.slug)
    else:
        rows = rows.filter(**{_SAMPLE_ROWS[scope]: t.obj.pk})
    if status:
        if len(status) == 3 and status.endswith("xx") and status[0] in "12345":
            low = int(status[0]) * 100
            rows = rows.filter(status__gte=low, status__lt=low + 100)
        elif status.isascii() and status.isdigit() and len(status) == 3:
            rows = rows.filter(status=int(status))
        elif status == "failed":
            rows = rows.filter(Q(status__gte=500) | Q(status__lt=0) | Q(by_proxy=True, status__gte=400))
        else:
            raise BadFilter("invalid_status", "status: a class (5xx), a code (503) or failed.", "status")
    if region:
        rows = rows.filter(region=region)
    if node:
        if not principal.is_operator:
            raise BadFilter("node_filter_operators_only", "Only operators see nodes; filter by region.", "node")
        rows = rows.filter(node=node)
    if since is not None:
        rows = rows.filter(at__gte=datetime.fromtimestamp(since, UTC))
    if until is not None:
        rows = rows.filter(at__lt=datetime.fromtimestamp(until, UTC))
    out = []
    for r in rows.order_by("-at", "-id")[:max(1, min(limit, SAMPLE_LIMIT_MAX))]:
        out.append({
            "at": r.at.timestamp(), "status": r.status, "by_proxy": r.by_proxy, "termination": r.termination,
            "host": r.host, "path": r.path, "route_id": r.route_id, "member_id": r.member_id, "region": r.region,
            "t_queue_ms": r.t_queue, "t_connect_ms": r.t_connect, "t_upstream_ms": r.t_upstream,
            "t_total_ms": r.t_total, "retries": r.retries, "bytes": r.bytes,
            **({"node": r.node} if principal.is_operator else {}),
        })
    return out


# --- the dashboard's top routes ----------------------------------------------------------------------------------

TOP_WINDOW_S = 900
TOP_LATENCY_CANDIDATES = 20  # the busiest routes whose p99 is read (histograms are read for these only)


def top_routes(principal: Any, *, limit: int = 5, window_s: int = TOP_WINDOW_S,
               now: float | None = None) -> dict[str, list[dict]]:
    """The principal's routes with the most 5xx, and the busiest routes' slowest p99, over the last `window_s`:
    counts summed in the database (one grouped query), histograms read for TOP_LATENCY_CANDIDATES routes."""
    from django.db.models import Sum

    now = time.time() if now is None else now
    rows = SignalBucket.objects.visible_to(principal).filter(
        kind=Kind.ROUTE, step_s=FINE_STEP_S, start__gte=datetime.fromtimestamp(now - window_s, UTC))
    totals = list(rows.values("ref_id").annotate(requests=Sum("requests"), s5xx=Sum("s5xx"))
                  .order_by("-requests")[:500])
    by_errors = sorted((t for t in totals if t["s5xx"]), key=lambda t: (-t["s5xx"], t["ref_id"]))[:limit]
    busiest = [t["ref_id"] for t in totals[:TOP_LATENCY_CANDIDATES]]
    latency: dict[int, list[int]] = {}
    for ref_id, t_total in rows.filter(ref_id__in=busiest).values_list("ref_id", "t_total").iterator(2000):
        hist.add_sparse(latency.setdefault(ref_id, hist.new()), t_total)
    p99 = {ref: hist.percentile(counts, 0.99) for ref, counts in latency.items()}
    by_latency = sorted((t for t in totals if p99.get(t["ref_id"]) is not None),
                        key=lambda t: (-p99[t["ref_id"]], t["ref_id"]))[:limit]
    routes = {r.pk: r for r in Route.objects.visible_to(principal).select_related("lb").filter(
        pk__in={t["ref_id"] for t in [*by_errors, *by_latency]})}

    def entry(t: dict) -> dict | None:
        route = routes.get(t["ref_id"])
        if route is None:  # deleted since
            return None
        return {"route": route, "requests": t["requests"], "rate": t["requests"] / window_s,
                "error_pct": 100.0 * t["s5xx"] / t["requests"] if t["requests"] else 0.0,
                "p99_ms": p99.get(t["ref_id"])}

    return {"errors": [e for e in map(entry, by_errors) if e], "latency": [e for e in map(entry, by_latency) if e]}
