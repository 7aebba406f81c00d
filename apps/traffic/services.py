"""Writes for traffic: record node samples, roll them into the overflow timeline, prune; what-if.

Data flow: every health collection (fleets, every 5 s) hands each node's readings to
`readings_record` -> one TrafficSample per node and pool (counter-based rates, see observe.py)
-> the pool's 10 s OverflowPoint bucket is recomputed from every node's samples in it ->
`overflow_downsample` folds 10 s points into 5 min points -> `traffic_prune` drops old rows.
Right after, the collector calls `capacity_record` with the health it just wrote. Traffic never
calls back into fleets.
"""

from __future__ import annotations

import logging
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol

from django.core.cache import cache
from django.db import connection, transaction
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.balancers.models import Pool, Region
from apps.core.errors import DomainError, NotFoundError
from apps.events.services import event_emit
from apps.traffic import readers, selectors
from apps.traffic.models import CapacityState, OverflowPoint, OverflowState, TrafficSample
from apps.traffic.observe import (
    MAX_COUNTER_GAP_S,
    BackendReading,
    NodePoolSample,
    enforced_plan,
    mean_by_node,
    node_samples,
    observed_flows,
    plan_to_dict,
    split_demand,
)
from apps.traffic.overflow import (
    POLICIES,
    PlanInputError,
    RegionCapacity,
    Steering,
    capacity_by_region,
    plan,
)

logger = logging.getLogger(__name__)

RAW_RETENTION_S: Final = 2 * 3600
FINE_RETENTION_S: Final = 24 * 3600
COARSE_RETENTION_S: Final = 30 * 86400
# Downsampling looks this far back each run, so a stopped beat catches up without rescanning all.
DOWNSAMPLE_LOOKBACK_S: Final = 6 * 3600
MAX_WHATIF_REGIONS: Final = 64
MAX_WHATIF_MEMBERS: Final = 100_000
MAX_WHATIF_RATE: Final = 1e9


class StatRowLike(Protocol):
    """What readings_from_stats needs of apps.fleets.node.showstat.StatRow."""

    pxname: str
    svname: str
    rate: int | None
    scur: int | None
    req_tot: int | None


@dataclass(frozen=True)
class NodeReadings:
    node_id: int | None
    node: str  # "fleet/node"
    region: str
    readings: Sequence[BackendReading]


def readings_from_stats(rows: Iterable[StatRowLike]) -> list[BackendReading]:
    """BACKEND rows of a `show stat` answer as readings (req_tot, else stot, is the counter)."""
    readings = []
    for row in rows:
        if row.svname != "BACKEND":
            continue
        total = row.req_tot
        if total is None:
            raw = getattr(row, "raw", None) or {}
            stot = raw.get("stot", "")
            total = int(stot) if stot.isdigit() else None
        readings.append(BackendReading(backend=row.pxname, rate_per_s=row.rate, sessions=row.scur,
                                       requests_total=total))
    return readings


# --- recording --------------------------------------------------------------------------------------


def readings_record(*, nodes: Sequence[NodeReadings], at: datetime) -> int:
    """Store one sample per node and pool, then refresh the touched pools' current 10 s bucket."""
    if not nodes:
        return 0
    previous = _previous_totals([n.node for n in nodes], at)
    samples: list[tuple[NodeReadings, NodePoolSample]] = []
    at_s = at.timestamp()
    for entry in nodes:
        for sample in node_samples(node=entry.node, region=entry.region, readings=entry.readings, at_s=at_s,
                                   previous=previous.get(entry.node, {})):
            samples.append((entry, sample))
    known = set(Pool.objects.filter(pk__in={s.pool_id for _, s in samples}).values_list("pk", flat=True))
    rows = [
        TrafficSample(time=at, pool_id=s.pool_id, node_id_ref=entry.node_id, node=entry.node[:128],
                      region=entry.region, request_rate=round(s.demand, 4), sessions=s.sessions,
                      served_local=round(s.local, 4), sent_to={k: round(v, 4) for k, v in s.sent_to.items()},
                      totals=s.totals)
        for entry, s in samples if s.pool_id in known
    ]
    with transaction.atomic():
        TrafficSample.objects.bulk_create(rows, ignore_conflicts=True)
        for pool_id in sorted({r.pool_id for r in rows}):
            overflow_bucket_refresh(pool_id=pool_id, time=at)
    return len(rows)


def _previous_totals(node_names: list[str], at: datetime) -> dict[str, dict[int, tuple[float, dict[str, int]]]]:
    """{node: {pool id: (time, backend totals)}} of each node's latest sample before `at`."""
    found: dict[str, dict[int, tuple[float, dict[str, int]]]] = defaultdict(dict)
    # The newest row per (node, pool) only, chosen by PostgreSQL: every row of the window was read and decoded
    # (12 per node and pool at one collection every 5 s: a seventh of a 67-node collection's CPU in its profile).
    window = TrafficSample.objects.filter(node__in=node_names, time__lt=at,
                                          time__gte=at - timedelta(seconds=MAX_COUNTER_GAP_S))
    if connection.features.can_distinct_on_fields:
        rows = (window.order_by("node", "pool_id", "-time").distinct("node", "pool_id")
                .values_list("node", "pool_id", "time", "totals"))
    else:  # SQLite (the zero-setup default): every row, the newest last
        rows = window.order_by("time").values_list("node", "pool_id", "time", "totals")
    for node, pool_id, time, totals in rows:
        found[node][pool_id] = (time.timestamp(), {k: int(v) for k, v in (totals or {}).items()})
    return found


def bucket_start(time: datetime, resolution_s: int) -> datetime:
    epoch = int(time.timestamp())
    return datetime.fromtimestamp(epoch - epoch % resolution_s, tz=time.tzinfo or UTC)


def overflow_bucket_refresh(*, pool_id: int, time: datetime, resolution_s: int = selectors.FINE_RESOLUTION_S) -> int:
    """Recompute one pool's per-region points for the fine bucket holding `time` from raw samples."""
    start = bucket_start(time, resolution_s)
    end = start + timedelta(seconds=resolution_s)
    # Columns, not model instances: every node's samples of the bucket are read again at each fleet's collection.
    raw = (TrafficSample.objects.filter(pool_id=pool_id, time__gte=start, time__lt=end).order_by("time")
           .values_list("node", "region", "served_local", "sent_to", "sessions"))
    samples = mean_by_node(
        NodePoolSample(pool_id=pool_id, node=node, region=region,
                       sent={region: served_local, **{k: float(v) for k, v in sent_to.items()}}, sessions=sessions)
        for node, region, served_local, sent_to, sessions in raw
    )
    try:
        caps = capacity_by_region(selectors.pool_capacities(pool_id))
    except PlanInputError:
        caps = {}
    flows = observed_flows(samples, caps)
    nodes_by_region: dict[str, int] = defaultdict(int)
    for s in samples:
        nodes_by_region[s.region] += 1
    points = [
        OverflowPoint(pool_id=pool_id, time=start, resolution_s=resolution_s, region=f.region,
                      capacity=None if math.isinf(f.capacity) else f.capacity, demand=f.demand, local=f.local,
                      out=f.out, inflow=f.in_, out_to=f.out_to, in_from=f.in_from, utilization=f.utilization,
                      nodes=nodes_by_region.get(f.region, 0))
        for f in flows
    ]
    written = _points_upsert(pool_id, start, resolution_s, points)
    if resolution_s == selectors.FINE_RESOLUTION_S:
        overflow_events_evaluate(pool_id=pool_id, now=time)
    return written


# Overflow events, with hysteresis: a region "starts" overflowing after START_BUCKETS complete 10 s buckets that
# each sent at least MIN_OUT_RPS out, and "stops" after STOP_BUCKETS complete buckets with data that sent less
# (or after SILENCE_S without any data). Only complete buckets count: the bucket being filled has the first
# samples of some nodes only, and reading it made a `stopped` with demand 0.0 and a `started` every 10 s.
START_BUCKETS = 2
STOP_BUCKETS = 3
MIN_OUT_RPS = 0.5
SILENCE_S = 300


def overflow_events_evaluate(*, pool_id: int, now: datetime) -> list[str]:
    """Send overflow.started / overflow.stopped for the pool's regions whose state changed, as the complete
    buckets before `now` show it; the event types sent. Idempotent: a transition is claimed once."""
    fine = selectors.FINE_RESOLUTION_S
    last = bucket_start(now, fine) - timedelta(seconds=fine)  # the newest complete bucket
    window = [last - timedelta(seconds=fine * i) for i in range(max(START_BUCKETS, STOP_BUCKETS))]
    points: dict[str, dict[datetime, OverflowPoint]] = defaultdict(dict)
    for point in OverflowPoint.objects.filter(pool_id=pool_id, resolution_s=fine, time__lte=last,
                                              time__gte=last - timedelta(seconds=SILENCE_S)):
        points[point.region][point.time] = point
    states = {s.region: s.overflowing for s in OverflowState.objects.filter(pool_id=pool_id)}
    sent = []
    for region in sorted(set(points) | {r for r, on in states.items() if on}):
        seen = points.get(region, {})
        recent = [seen.get(t) for t in window]
        if not states.get(region, False):
            rising = recent[:START_BUCKETS]
            overflowing = all(p is not None and p.out >= MIN_OUT_RPS for p in rising)
            if overflowing and _overflow_transition(pool_id, region, True, now):
                _overflow_emit(pool_id, "overflow.started", region, rising)  # type: ignore[arg-type]
                sent.append("overflow.started")
            continue
        with_data = [p for p in recent[:STOP_BUCKETS] if p is not None]
        silent = not seen
        calm = len(with_data) == STOP_BUCKETS and all(p.out < MIN_OUT_RPS for p in with_data)
        if (calm or silent) and _overflow_transition(pool_id, region, False, now):
            _overflow_emit(pool_id, "overflow.stopped", region, with_data)
            sent.append("overflow.stopped")
    return sent


def _overflow_transition(pool_id: int, region: str, overflowing: bool, now: datetime) -> bool:
    OverflowState.objects.get_or_create(pool_id=pool_id, region=region)
    return bool(OverflowState.objects.filter(pool_id=pool_id, region=region, overflowing=not overflowing)
                .update(overflowing=overflowing, changed_at=now))


def _overflow_emit(pool_id: int, event_type: str, region: str, points: list[OverflowPoint]) -> None:
    """The figures are the mean of the buckets that decided it (none: no traffic was seen at all)."""
    pool = Pool.objects.select_related("org").get(pk=pool_id)
    n = len(points) or 1
    out_to: dict[str, float] = defaultdict(float)
    for p in points:
        for dst, rate in p.out_to.items():
            out_to[dst] += float(rate) / n
    capacities = [p.capacity for p in points if p.capacity is not None]
    event_emit(event_type, org=pool.org, obj=pool, data={
        "region": region, "out_rps": round(sum(p.out for p in points) / n, 3),
        "demand_rps": round(sum(p.demand for p in points) / n, 3),
        "out_to": {k: round(v, 3) for k, v in sorted(out_to.items())},
        "capacity_rps": round(sum(capacities) / len(capacities), 3) if capacities else None,
        "buckets": len(points), "traffic_seen": bool(points)})


def _points_upsert(pool_id: int, start: datetime, resolution_s: int, points: list[OverflowPoint]) -> int:
    OverflowPoint.objects.bulk_create(
        points, update_conflicts=True, unique_fields=["pool", "resolution_s", "time", "region"],
        update_fields=["capacity", "demand", "local", "out", "inflow", "out_to", "in_from", "utilization", "nodes"],
    )
    OverflowPoint.objects.filter(pool_id=pool_id, resolution_s=resolution_s, time=start).exclude(
        region__in=[p.region for p in points]).delete()
    return len(points)


# --- downsampling and retention ---------------------------------------------------------------------------


def overflow_downsample(*, now: datetime | None = None) -> int:
    """Fold complete 5 min buckets of 10 s points into 5 min points (means over the 10 s buckets
    that have data). Idempotent: re-running rewrites the same rows."""
    now = now or timezone.now()
    coarse = selectors.COARSE_RESOLUTION_S
    last_complete = bucket_start(now, coarse)
    since = last_complete - timedelta(seconds=DOWNSAMPLE_LOOKBACK_S)
    fine = (OverflowPoint.objects.filter(resolution_s=selectors.FINE_RESOLUTION_S, time__gte=since,
                                         time__lt=last_complete).order_by("pool_id", "time"))
    groups: dict[tuple[int, datetime], list[OverflowPoint]] = defaultdict(list)
    for point in fine.iterator():
        groups[(point.pool_id, bucket_start(point.time, coarse))].append(point)
    written = 0
    for (pool_id, start), points in sorted(groups.items()):
        written += _points_upsert(pool_id, start, coarse, _coarse_points(pool_id, start, points))
    return written


def _coarse_points(pool_id: int, start: datetime, points: list[OverflowPoint]) -> list[OverflowPoint]:
    buckets = len({p.time for p in points})
    by_region: dict[str, list[OverflowPoint]] = defaultdict(list)
    for p in points:
        by_region[p.region].append(p)
    result = []
    for region, rows in sorted(by_region.items()):
        capacities = [r.capacity for r in rows]
        capacity = None if any(c is None for c in capacities) else sum(capacities) / len(capacities)  # type: ignore[arg-type]
        out_to: dict[str, float] = defaultdict(float)
        in_from: dict[str, float] = defaultdict(float)
        for r in rows:
            for k, v in r.out_to.items():
                out_to[k] += float(v) / buckets
            for k, v in r.in_from.items():
                in_from[k] += float(v) / buckets
        local = sum(r.local for r in rows) / buckets
        inflow = sum(r.inflow for r in rows) / buckets
        result.append(OverflowPoint(
            pool_id=pool_id, time=start, resolution_s=selectors.COARSE_RESOLUTION_S, region=region,
            capacity=capacity, demand=sum(r.demand for r in rows) / buckets, local=local,
            out=sum(r.out for r in rows) / buckets, inflow=inflow, out_to=dict(out_to), in_from=dict(in_from),
            utilization=(local + inflow) / capacity if capacity else 0.0, nodes=max(r.nodes for r in rows),
        ))
    return result


def traffic_prune(*, now: datetime | None = None) -> dict[str, int]:
    """Drop raw samples after 2 h, 10 s points after a day, 5 min points after 30 days."""
    now = now or timezone.now()
    raw, _ = TrafficSample.objects.filter(time__lt=now - timedelta(seconds=RAW_RETENTION_S)).delete()
    fine, _ = OverflowPoint.objects.filter(resolution_s=selectors.FINE_RESOLUTION_S,
                                           time__lt=now - timedelta(seconds=FINE_RETENTION_S)).delete()
    coarse, _ = OverflowPoint.objects.filter(resolution_s=selectors.COARSE_RESOLUTION_S,
                                             time__lt=now - timedelta(seconds=COARSE_RETENTION_S)).delete()
    return {"samples": raw, "fine_points": fine, "coarse_points": coarse}


# --- capacity seen now ------------------------------------------------------------------------------------------


def capacity_record() -> list[int]:
    """Record every HAProxy pool's capacity per region as the fresh health gives it; returns the ids of
    the LBs whose capacity changed (members went down or up behind the desired state's back).

    Desired-state changes (PoolRegion, Member) already bump the LB revision and re-render; the fleets
    health collector calls this right after each collection and re-renders the fleets of the LBs
    returned (`fleets.services.fleet_capacity_follow`). Traffic itself re-drives nothing.
    """
    pools = list(Pool.objects.filter(lb__kind="haproxy").only("pk", "lb_id"))
    current = selectors.pool_capacities_many(pools)
    known = {(s.pool_id, s.region): s for s in CapacityState.objects.filter(pool__in=pools)}
    changed_lbs: set[int] = set()
    for pool in pools:
        for cap in current.get(pool.pk, []):
            value = None if math.isinf(cap.capacity) else cap.capacity
            state = known.pop((pool.pk, cap.region), None)
            if state is None:
                CapacityState.objects.create(pool=pool, region=cap.region, healthy_members=cap.healthy_members,
                                             capacity=value)
                continue  # first sight is a baseline, not a change
            if state.healthy_members != cap.healthy_members or state.capacity != value:
                state.healthy_members, state.capacity = cap.healthy_members, value
                state.save(update_fields=["healthy_members", "capacity", "updated_at"])
                changed_lbs.add(pool.lb_id)
    if known:
        CapacityState.objects.filter(pk__in=[s.pk for s in known.values()]).delete()
    return sorted(changed_lbs)


# --- what-if ---------------------------------------------------------------------------------------------


def _number(value: Any, field: str, *, allow_none: bool = False, integer: bool = False) -> float | int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise DomainError("invalid_number", f"{field} must be a number.", field=field)
    if not math.isfinite(value) or value < 0 or value > MAX_WHATIF_RATE:
        raise DomainError("invalid_number", f"{field} must be a finite number between 0 and 1e9.", field=field)
    if integer:
        if int(value) != value:
            raise DomainError("invalid_number", f"{field} must be a whole number.", field=field)
        return int(value)
    return float(value)


def _capacity_overrides(entries: Any, base: dict[str, RegionCapacity]) -> dict[str, RegionCapacity]:
    if not isinstance(entries, list):
        raise DomainError("invalid_capacities", "capacities must be a list of per-region objects.",
                          field="capacities")
    if len(entries) > MAX_WHATIF_REGIONS:
        raise DomainError("too_many_regions", f"At most {MAX_WHATIF_REGIONS} regions.", field="capacities")
    result = dict(base)
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        where = f"capacities[{i}]"
        if not isinstance(entry, dict):
            raise DomainError("invalid_capacities", f"{where} must be an object.", field=where)
        unknown = set(entry) - {"region", "healthy_members", "max_rate_per_member", "capacity_scaler"}
        if unknown:
            raise DomainError("unknown_field", f"{where} has unknown fields: {', '.join(sorted(unknown))}.",
                              field=where)
        region = entry.get("region")
        if not isinstance(region, str) or not region:
            raise DomainError("invalid_region", f"{where}.region must be a region slug.", field=f"{where}.region")
        if region in seen:
            raise DomainError("duplicate_region", f"Region {region} is listed twice.", field=f"{where}.region")
        seen.add(region)
        current = result.get(region) or RegionCapacity(region=region, healthy_members=0, max_rate_per_member=None)
        members = entry.get("healthy_members", current.healthy_members)
        members = _number(members, f"{where}.healthy_members", integer=True)
        if members is not None and members > MAX_WHATIF_MEMBERS:
            raise DomainError("invalid_number", f"{where}.healthy_members must be at most {MAX_WHATIF_MEMBERS}.",
                              field=f"{where}.healthy_members")
        rate = _number(entry.get("max_rate_per_member", current.max_rate_per_member),
                       f"{where}.max_rate_per_member", allow_none=True)
        scaler = _number(entry.get("capacity_scaler", current.capacity_scaler), f"{where}.capacity_scaler")
        try:
            result[region] = RegionCapacity(region=region, healthy_members=int(members or 0),
                                            max_rate_per_member=rate, capacity_scaler=float(scaler or 0.0))
        except PlanInputError as exc:
            raise DomainError(exc.code, exc.message, field=where) from exc
    return result


def _demand(entries: Any) -> dict[str, float]:
    if not isinstance(entries, dict):
        raise DomainError("invalid_demand", "demand must be an object {region: req/s}.", field="demand")
    if len(entries) > MAX_WHATIF_REGIONS:
        raise DomainError("too_many_regions", f"At most {MAX_WHATIF_REGIONS} regions.", field="demand")
    return {str(region): float(_number(rate, f"demand.{region}") or 0.0) for region, rate in sorted(entries.items())}


_STEERING_KEYS = {"preferred", "failed_over", "drained", "dials"}


def _steering(raw: Any, current: Steering) -> Steering:
    """The what-if's proposed steering: each key given replaces the pool's current one."""
    if not isinstance(raw, dict) or set(raw) - _STEERING_KEYS:
        raise DomainError("invalid_steering", f"steering must be an object with keys among "
                          f"{', '.join(sorted(_STEERING_KEYS))}.", field="steering")
    lists = {}
    for key in ("preferred", "failed_over", "drained"):
        value = raw.get(key)
        if value is None:
            continue
        if not isinstance(value, list) or len(value) > 100 or not all(isinstance(x, str) and x for x in value):
            raise DomainError("invalid_steering", f"steering.{key} must be a list of region slugs.", field="steering")
        lists[key] = value
    dials = raw.get("dials", dict(current.dials))
    if not isinstance(dials, dict) or len(dials) > 100:
        raise DomainError("invalid_steering", "steering.dials must map region slugs to 0..1.", field="steering")
    try:
        return Steering(preferred=tuple(lists.get("preferred", current.preferred)),
                        failed_over=frozenset(lists.get("failed_over", current.failed_over)),
                        drained=frozenset(lists.get("drained", current.drained)), dials=dials)
    except PlanInputError as exc:
        raise DomainError(exc.code, exc.message, field="steering") from exc


def what_if(*, principal: Principal, data: Mapping[str, Any]) -> dict[str, Any]:
    """The plan for proposed capacities and/or demand; nothing is changed.

    `data`: pool (id, optional: start from its current capacities, policy, observed demand of the
    last 5 min and its fleets' nodes), policy, capacities ([{region, healthy_members,
    max_rate_per_member, capacity_scaler}], merged over the pool's by region), demand ({region:
    req/s}). Without a pool, capacities and demand are required. Returns the proposed plan, the
    baseline plan (current capacities, same demand), and for a pool served by HAProxy nodes the
    per-node chains the proposal would render and what those chains would serve (`enforced`).
    """
    unknown = set(data) - {"pool", "policy", "capacities", "demand", "steering"}
    if unknown:
        raise DomainError("unknown_field", f"Unknown fields: {', '.join(sorted(unknown))}.",
                          field=sorted(unknown)[0])
    pool: Pool | None = None
    base: dict[str, RegionCapacity] = {}
    if data.get("pool") is not None:
        pool_id = data["pool"]
        if isinstance(pool_id, bool) or not isinstance(pool_id, int | str) or not str(pool_id).isdigit():
            raise DomainError("invalid_pool", "pool must be a pool id.", field="pool")
        # A foreign pool answers exactly like a missing one.
        pool = Pool.objects.visible_to(principal).select_related("lb").filter(pk=int(pool_id)).first()
        if pool is None:
            raise NotFoundError("No such pool.", field="pool")
        try:
            base = {c.region: c for c in selectors.pool_capacities(pool)}
        except PlanInputError as exc:
            raise DomainError(exc.code, exc.message, field="pool") from exc
    elif "capacities" not in data or "demand" not in data:
        raise DomainError("pool_or_inputs_required",
                          "Give a pool, or both capacities and demand.", field="pool")

    policy = data.get("policy") or (pool.overflow_policy if pool else "waterfall")
    if policy not in POLICIES:
        raise DomainError("invalid_policy", f"policy must be one of {', '.join(POLICIES)}.", field="policy")
    proposed = _capacity_overrides(data.get("capacities", []), base)
    known_regions = set(Region.objects.filter(slug__in=list(proposed)).values_list("slug", flat=True))
    for region in sorted(set(proposed) - set(base) - known_regions):
        raise DomainError("unknown_region", f"Region {region} does not exist.", field="capacities")

    observed_from = None
    if "demand" in data:
        demand = _demand(data["demand"])
        strangers = set(demand) - set(proposed)
        strangers -= set(Region.objects.filter(slug__in=list(strangers)).values_list("slug", flat=True))
        for region in sorted(strangers):
            raise DomainError("unknown_region", f"Region {region} does not exist.", field="demand")
    else:
        observed = selectors.observed_overflow(pool, 300) if pool else None  # type: ignore[arg-type]
        demand = {r["region"]: r["demand"] for r in observed["regions"] if r["demand"] > 0} if observed else {}
        observed_from = "last 5 min"
    dist = selectors.distances()
    proposed_list = [proposed[r] for r in sorted(proposed)]
    current = selectors.pool_steering_now(pool) if pool else Steering()
    steering = _steering(data["steering"], current) if "steering" in data else current
    try:
        proposed_plan = plan(demand, proposed_list, dist, policy, steering)
        baseline = plan(demand, [base[r] for r in sorted(base)], dist, policy, current) if pool else None
    except PlanInputError as exc:
        raise DomainError(exc.code, exc.message) from exc

    result: dict[str, Any] = {
        "pool": pool.pk if pool else None,
        "policy": policy,
        "steering": selectors.steering_to_dict(steering),
        "demand": demand,
        "demand_source": observed_from or "request",
        "capacities": [
            {"region": c.region, "healthy_members": c.healthy_members, "max_rate_per_member": c.max_rate_per_member,
             "capacity_scaler": c.capacity_scaler,
             "capacity": None if math.isinf(c.capacity) else round(c.capacity, 3)}
            for c in proposed_list
        ],
        "plan": plan_to_dict(proposed_plan),
        "baseline": plan_to_dict(baseline) if baseline else None,
        "enforced": None,
    }
    if pool is not None:
        nodes = readers.pool_nodes(pool)
        if nodes:
            node_demand = split_demand(demand, nodes)
            for region, names in nodes.items():
                for name in names:
                    node_demand.setdefault(name, (region, 0.0))
            chains, weights = selectors.node_chains(proposed_list, dist, policy, node_demand, steering, pool.overload)
            enforced = enforced_plan(node_demand, chains, steering.effective(capacity_by_region(proposed_list)),
                                     policy, pool.overload, weights)  # type: ignore[arg-type]
            result["enforced"] = plan_to_dict(enforced) | {
                "chains": {n: selectors.chain_to_dict(c) for n, c in chains.items()},
                "nodes_per_region": {r: len(n) for r, n in nodes.items()},
                "demand_without_nodes": {r: v for r, v in demand.items() if r not in nodes and v > 0},
            }
    return result


def drill_drain(*, pool_id: int, region: str, share: float, ttl_s: float) -> None:
    """Drain `share` of a pool's region (1.0: all of it) for a failover drill, or renew that drain. The
    enforcement loop applies it at its next run (`selectors.pool_steerings(live=True)`); the entry expires
    after `ttl_s` unless renewed, so a drill whose worker dies cannot leave the region drained."""
    cache.set(selectors.DRILL_KEY.format(pool_id), {"region": region, "share": float(share)},
              timeout=max(1, math.ceil(ttl_s)))


def drill_restore(*, pool_id: int) -> None:
    cache.delete(selectors.DRILL_KEY.format(pool_id))
