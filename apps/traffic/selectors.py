"""Reads for traffic: pool capacities (health-aware), region distances, chains, observed overflow.

`pool_capacities_many` is what the fleets snapshot builder calls to compute each node's overflow
chain (`shares.static_steps`), so the planner, the what-if and the rendered configs agree on
one capacity model: healthy members x max_rate_per_member x capacity_scaler.
"""

from __future__ import annotations

import logging
import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Final

from django.core.cache import cache
from django.db.models import Count, Q, QuerySet, Sum
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.balancers.models import Member, Pool, PoolRegion, RegionDistance
from apps.traffic import readers
from apps.traffic.models import CapacityState, OverflowPoint, TrafficSample
from apps.traffic.observe import (
    NodePoolSample,
    enforced_plan,
    flow_to_dict,
    mean_by_node,
    parse_backend,
    plan_to_dict,
)
from apps.traffic.overflow import Distances, PlanInputError, RegionCapacity, Steering, capacity_by_region, plan
from apps.traffic.shares import absorb_weights, planned_limits
from apps.traffic.steering import Decision
from apps.traffic.thresholds import Step

logger = logging.getLogger(__name__)

# The fleets collector refreshes its hot copy every 5 s; a row older than this is a node that
# stopped answering, and its view of member health no longer counts.
HEALTH_FRESH_S: Final = 30.0
# Finest timeline resolution, and the coarse one longer windows use (see services for retention).
FINE_RESOLUTION_S: Final = 10
COARSE_RESOLUTION_S: Final = 300
FINE_WINDOW_MAX_S: Final = 6 * 3600
MIN_WINDOW_S: Final = 10
MAX_WINDOW_S: Final = 30 * 86400
_WINDOW_RE = re.compile(r"^(\d{1,7})([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


class WindowError(ValueError):
    pass


def parse_window(text: str) -> int:
    """"90", "30s", "5m", "6h", "7d" -> seconds, within 10 s .. 30 days."""
    match = _WINDOW_RE.match(text.strip().lower())
    if not match:
        raise WindowError(f"window must look like 30s, 5m, 6h or 7d, got {text!r}")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if not MIN_WINDOW_S <= seconds <= MAX_WINDOW_S:
        raise WindowError(f"window must be between {MIN_WINDOW_S} s and 30 days, got {seconds} s")
    return seconds


def distances() -> dict[tuple[str, str], float]:
    """{(src slug, dst slug): rtt_ms} for every stored pair (the planner treats them as symmetric)."""
    return {(src, dst): rtt for src, dst, rtt in
            RegionDistance.objects.values_list("src__slug", "dst__slug", "rtt_ms")}


# --- capacities ------------------------------------------------------------------------------------


def _healthy_status(status: str) -> bool:
    # "UP", "UP 1/3" (failing but still up), "no check" (unchecked servers count as up).
    # DOWN, MAINT, DRAIN and NOLB take no new traffic, so they add no capacity.
    return status.startswith("UP") or status == "no check"


def member_health(pool_ids: Iterable[int], *, now: datetime | None = None) -> dict[tuple[int, str, str], bool]:
    """{(pool id, region, member name): healthy} from the nodes' `show stat` (fleets' hot copy, readers).

    Every fresh report of every node counts; a member is healthy when at least half of them say
    so (a single node's network trouble must not take capacity away from the whole fleet). A
    member no node reported on recently is absent: the caller falls back to its admin state.
    """
    wanted = set(pool_ids)
    since = (now or timezone.now()) - timedelta(seconds=HEALTH_FRESH_S)
    votes: dict[tuple[int, str, str], list[int]] = defaultdict(lambda: [0, 0])
    for proxy, server, status in readers.health_rows(since):
        ref = parse_backend(proxy)
        if ref is None or ref.pool_id not in wanted:
            continue
        vote = votes[(ref.pool_id, ref.region, server)]
        vote[0] += 1
        vote[1] += 1 if _healthy_status(status) else 0
    return {key: healthy * 2 >= total for key, (total, healthy) in votes.items()}


def pool_steerings(pools: Iterable[Pool], *, live: bool = False) -> dict[int, Steering]:
    """{pool id: its configured steering} (preferred regions, traffic dials; one query); `live` adds a running
    drill's drain (the enforcement loop's view; a rendered config never holds it). The decisions that
    follow health (failed over, drained) are the enforcement loop's (`traffic.steering`)."""
    pools = list(pools)
    dials: dict[int, dict[str, float]] = defaultdict(dict)
    for pool_id, slug, dial in PoolRegion.objects.filter(pool__in=pools).exclude(traffic_dial=1.0).values_list(
            "pool_id", "region__slug", "traffic_dial"):
        dials[pool_id][slug] = dial
    drills = cache.get_many([DRILL_KEY.format(p.pk) for p in pools]) if pools and live else {}
    out = {}
    for p in pools:
        steering = Steering(preferred=tuple(p.preferred_regions or ()), dials=dials.get(p.pk, {}))
        out[p.pk] = with_drill(steering, drills.get(DRILL_KEY.format(p.pk)))
    return out


DECISION_KEY: Final = "spillway:steering:{}"  # the enforcement loop's failover / drain decision per pool
# A failover drill's drain of one region (capacity.drills): {"region": slug, "share": 0..1}. A lease in the cache
# the drill renews every second (5 s to live), so a drill whose worker dies restores the region by itself.
DRILL_KEY: Final = "spillway:drill:{}"


def with_drill(steering: Steering, drill: Mapping[str, Any] | None) -> Steering:
    """The steering with a drill's drain on top: the whole region drained, or its dial lowered by the share."""
    if not drill:
        return steering
    region, share = str(drill["region"]), float(drill["share"])
    if share >= 1.0:
        return steering.adding(drained=[region])
    return replace(steering, dials={**steering.dials, region: min(steering.dial(region), 1.0 - share)})


def pool_steering_now(pool: Pool) -> Steering:
    """The pool's steering as the nodes apply it now: configured, plus the enforcement loop's decision."""
    config = pool_steerings([pool], live=True)[pool.pk]
    decision = Decision.from_json(cache.get(DECISION_KEY.format(pool.pk)))
    return config.adding(failed_over=decision.failed_over, drained=decision.drained)


def steering_to_dict(steering: Steering) -> dict[str, Any]:
    return {"preferred": list(steering.preferred), "failed_over": sorted(steering.failed_over),
            "drained": sorted(steering.drained), "dials": dict(sorted(steering.dials.items()))}


def pool_capacities_many(
    pools: Iterable[Pool | int], *, now: datetime | None = None, use_health: bool = True
) -> dict[int, list[RegionCapacity]]:
    """{pool id: capacity per region, by region slug}, in three queries whatever the pool count.

    Regions are those with a PoolRegion row or a member. A member counts as healthy when its admin
    state is active and the fleet's nodes see it up (`member_health`; no recent report -> its admin
    state alone). A pool whose rows the planner refuses (logged) is left out: render it without a
    chain.
    """
    pool_ids = sorted({p if isinstance(p, int) else p.pk for p in pools})
    rows: dict[int, dict[str, PoolRegion]] = defaultdict(dict)
    for pr in PoolRegion.objects.filter(pool_id__in=pool_ids).select_related("region"):
        rows[pr.pool_id][pr.region.slug] = pr
    members: dict[int, dict[str, list[tuple[str, str]]]] = defaultdict(lambda: defaultdict(list))
    for pool_id, region, name, state in Member.objects.filter(pool_id__in=pool_ids).values_list(
        "pool_id", "region__slug", "name", "admin_state"
    ):
        members[pool_id][region].append((name, state))
    health = member_health(pool_ids, now=now) if use_health else {}

    result: dict[int, list[RegionCapacity]] = {}
    for pool_id in pool_ids:
        by_region = members.get(pool_id, {})
        capacities = []
        try:
            for region in sorted(set(rows.get(pool_id, {})) | set(by_region)):
                pr = rows.get(pool_id, {}).get(region)
                healthy = sum(
                    1 for name, state in by_region.get(region, [])
                    if state == Member.AdminState.ACTIVE and health.get((pool_id, region, name), True)
                )
                capacities.append(RegionCapacity(
                    region=region,
                    healthy_members=healthy,
                    max_rate_per_member=pr.max_rate_per_member if pr else None,
                    capacity_scaler=pr.capacity_scaler if pr else 1.0,
                ))
        except PlanInputError as exc:
            logger.warning("pool %s: capacity rows refused (%s); it renders without an overflow chain",
                           pool_id, exc.message)
            continue
        result[pool_id] = capacities
    return result


def pool_capacities(pool: Pool | int, *, now: datetime | None = None, use_health: bool = True
                    ) -> list[RegionCapacity]:
    """One pool's capacity per region (see pool_capacities_many); raises PlanInputError on bad rows."""
    pool_id = pool if isinstance(pool, int) else pool.pk
    found = pool_capacities_many([pool_id], now=now, use_health=use_health)
    if pool_id not in found:
        raise PlanInputError("invalid_capacity", f"pool {pool_id} has capacity rows the planner refuses")
    return found[pool_id]


# --- nodes and chains --------------------------------------------------------------------------------


def node_chains(
    capacities: list[RegionCapacity], dist: Distances, policy: str, node_demand: Mapping[str, tuple[str, float]],
    steering: Steering | None = None, overload: str = "absorb",
) -> tuple[dict[str, list[Step]], dict[str, dict[str, float]]]:
    """({node: its chain with the limits the enforcement loop sets for this demand}, {node: its overload
    weights}) (traffic.shares)."""
    steering = steering or Steering()
    node_regions = {n: r for n, (r, _) in node_demand.items()}
    limits, result = planned_limits(capacities, node_regions, {n: d for n, (_, d) in node_demand.items()},
                                    dist, policy, steering, overload)  # type: ignore[arg-type]
    weights = absorb_weights(policy, capacities, node_regions, dist, result, steering)  # type: ignore[arg-type]
    return {node: list(row.items()) for node, row in sorted(limits.items())}, weights


def chain_to_dict(steps: list[Step]) -> list[dict[str, Any]]:
    return [{"region": region, "rate_limit_per_node": limit} for region, limit in steps]


# --- observation ---------------------------------------------------------------------------------------


def _sample_from_row(row: TrafficSample) -> NodePoolSample:
    sent = {row.region: row.served_local, **{k: float(v) for k, v in row.sent_to.items()}}
    return NodePoolSample(pool_id=row.pool_id, node=row.node, region=row.region, sent=sent, sessions=row.sessions)


def _points_in(pool: Pool, window_s: int, now: datetime) -> tuple[int, list[OverflowPoint]]:
    since = now - timedelta(seconds=window_s)
    if window_s <= FINE_WINDOW_MAX_S:
        points = list(OverflowPoint.objects.filter(pool=pool, resolution_s=FINE_RESOLUTION_S,
                                                   time__gte=since, time__lte=now).order_by("time", "region"))
        return FINE_RESOLUTION_S, points
    coarse = list(OverflowPoint.objects.filter(pool=pool, resolution_s=COARSE_RESOLUTION_S,
                                               time__gte=since, time__lte=now).order_by("time", "region"))
    # The newest minutes are not downsampled yet: show them at the fine resolution.
    tail_from = coarse[-1].time + timedelta(seconds=COARSE_RESOLUTION_S) if coarse else since
    fine = OverflowPoint.objects.filter(pool=pool, resolution_s=FINE_RESOLUTION_S,
                                        time__gte=tail_from, time__lte=now).order_by("time", "region")
    return COARSE_RESOLUTION_S, coarse + list(fine)


def _point_dict(point: OverflowPoint) -> dict[str, Any]:
    return {
        "region": point.region,
        "capacity": point.capacity,
        "demand": round(point.demand, 3),
        "local": round(point.local, 3),
        "out": round(point.out, 3),
        "in": round(point.inflow, 3),
        "out_to": point.out_to,
        "in_from": point.in_from,
        "utilization": round(point.utilization, 4),
        "nodes": point.nodes,
    }


def observed_overflow(pool: Pool, window_s: int, *, now: datetime | None = None) -> dict[str, Any]:
    """What the pool's traffic did per region over the last `window_s` seconds.

    - `regions`: per region, the mean over the window's buckets (a bucket where a region had no
      traffic counts as zero), with the current capacity;
    - `latest`: the newest bucket;
    - `plan`: `overflow.plan` for the mean demand and the current capacities (GCP's global view);
    - `expected`: what the rendered chains serve for the nodes' observed demand (`enforced_plan`);
      it differs from `plan` by the per-node share rule, and from `regions` only when configs or
      load changed during the window;
    - `series`: columns for charts: `time` (epoch s) and per region demand/local/out/in/capacity.
    """
    now = now or timezone.now()
    resolution_s, points = _points_in(pool, window_s, now)
    capacities = pool_capacities(pool)
    caps = capacity_by_region(capacities)
    dist = distances()
    steering = pool_steering_now(pool)

    times = sorted({p.time for p in points})
    regions = sorted(set(caps) | {p.region for p in points})
    index = {t: i for i, t in enumerate(times)}
    series: dict[str, dict[str, list[float | None]]] = {
        region: {key: [0.0] * len(times) for key in ("demand", "local", "out", "in")}
        | {"capacity": [None] * len(times)}
        for region in regions
    }
    sums: dict[str, dict[str, float]] = {r: defaultdict(float) for r in regions}
    out_to: dict[str, dict[str, float]] = {r: defaultdict(float) for r in regions}
    in_from: dict[str, dict[str, float]] = {r: defaultdict(float) for r in regions}
    for p in points:
        i = index[p.time]
        column = series[p.region]
        column["demand"][i], column["local"][i], column["out"][i], column["in"][i] = (
            round(p.demand, 3), round(p.local, 3), round(p.out, 3), round(p.inflow, 3))
        column["capacity"][i] = p.capacity
        for key, value in (("demand", p.demand), ("local", p.local), ("out", p.out), ("in", p.inflow)):
            sums[p.region][key] += value
        for k, v in p.out_to.items():
            out_to[p.region][k] += float(v)
        for k, v in p.in_from.items():
            in_from[p.region][k] += float(v)

    buckets = max(len(times), 1)
    summary = []
    for region in regions:
        capacity = caps.get(region, 0.0)
        local, inflow = sums[region]["local"] / buckets, sums[region]["in"] / buckets
        summary.append({
            "region": region,
            "capacity": None if math.isinf(capacity) else round(capacity, 3),
            "demand": round(sums[region]["demand"] / buckets, 3),
            "local": round(local, 3),
            "out": round(sums[region]["out"] / buckets, 3),
            "in": round(inflow, 3),
            "out_to": {k: round(v / buckets, 3) for k, v in sorted(out_to[region].items())},
            "in_from": {k: round(v / buckets, 3) for k, v in sorted(in_from[region].items())},
            "utilization": round((local + inflow) / capacity, 4) if 0 < capacity < math.inf else 0.0,
        })
    latest = None
    if times:
        last = times[-1]
        latest = {"time": last.isoformat(),
                  "regions": [_point_dict(p) for p in points if p.time == last]}

    demand = {row["region"]: row["demand"] for row in summary if row["demand"] > 0}
    return {
        "pool": {"id": pool.pk, "name": pool.name, "lb": pool.lb_id, "policy": pool.overflow_policy,
                 "steering": steering_to_dict(steering)},
        "now": now.isoformat(),
        "window_s": window_s,
        "resolution_s": resolution_s,
        "buckets": len(times),
        "regions": summary,
        "latest": latest,
        "plan": plan_to_dict(plan(demand, capacities, dist, pool.overflow_policy, steering)),  # type: ignore[arg-type]
        "expected": _expected(pool, capacities, dist, window_s, now, steering),
        "series": {"time": [int(t.timestamp()) for t in times], "regions": series},
    }


def _expected(pool: Pool, capacities: list[RegionCapacity], dist: Distances, window_s: int,
              now: datetime, steering: Steering) -> dict[str, Any] | None:
    """enforced_plan for each node's mean demand in the window (raw samples only; None without)."""
    rows = TrafficSample.objects.filter(pool=pool, time__gte=now - timedelta(seconds=window_s), time__lte=now)
    samples = mean_by_node(_sample_from_row(r) for r in rows)
    if not samples:
        return None
    node_demand = {s.node: (s.region, s.demand) for s in samples}
    for region, names in readers.pool_nodes(pool).items():
        for name in names:  # idle nodes get their share of their region's spare capacity too
            node_demand.setdefault(name, (region, 0.0))
    chains, weights = node_chains(capacities, dist, pool.overflow_policy, node_demand, steering, pool.overload)
    result = enforced_plan(node_demand, chains, steering.effective(capacity_by_region(capacities)),
                           pool.overflow_policy, pool.overload, weights)  # type: ignore[arg-type]
    return plan_to_dict(result) | {"chains": {n: chain_to_dict(c) for n, c in chains.items()}}


def pool_overview(pool_qs) -> list[dict[str, Any]]:
    """Pools (already scoped) with their current capacity per region, for the overview page."""
    pools = list(pool_qs.select_related("lb").order_by("lb__name", "name"))
    caps = pool_capacities_many(pools)
    return [
        {"pool": pool, "regions": [
            {"region": c.region, "healthy_members": c.healthy_members,
             "capacity": None if math.isinf(c.capacity) else round(c.capacity, 3)}
            for c in caps.get(pool.pk, [])]}
        for pool in pools
    ]


# --- dashboard: overflow per region over every visible pool ------------------------------------------

# The dashboard sums every pool, so it reads 10 s points only for short windows (a 6 h window of
# 10 s points for hundreds of pools is millions of rows); longer windows read 5 min points.
DASHBOARD_FINE_MAX_S: Final = 3600
TOP_OVERFLOWING: Final = 5


def _bucket_starts(since: datetime, until: datetime, resolution_s: int) -> list[datetime]:
    """Starts of the `resolution_s` buckets (epoch-aligned, as recorded) within [since, until]."""
    first = -(-int(since.timestamp()) // resolution_s) * resolution_s
    return [datetime.fromtimestamp(t, tz=since.tzinfo) for t in range(first, int(until.timestamp()) + 1, resolution_s)]


def _region_sums(points: QuerySet[OverflowPoint]) -> list[dict[str, Any]]:
    """One row per (bucket, region), summed over pools in SQL. Capacity sums the limited pools
    (None when every pool there is unlimited); `unlimited` counts the others."""
    return list(points.values("time", "region").annotate(
        demand_sum=Sum("demand"), local_sum=Sum("local"), out_sum=Sum("out"), in_sum=Sum("inflow"),
        capacity_sum=Sum("capacity"), unlimited=Count("pk", filter=Q(capacity__isnull=True)),
    ).order_by("time", "region"))


def region_overflow(principal: Principal, window_s: int, *, now: datetime | None = None) -> dict[str, Any]:
    """Overflow per region summed over the pools the principal sees: the newest bucket, the mean
    over the window, the capacity now (CapacityState), a chart series and the pools overflowing most.

    Four or five queries whatever the number of pools, points or regions. An operator's sums need
    no join with pools (every pool counts), which matters with hundreds of pools.
    """
    now = now or timezone.now()
    since = now - timedelta(seconds=window_s)
    base = OverflowPoint.objects.visible_to(principal)
    resolution_s = FINE_RESOLUTION_S if window_s <= DASHBOARD_FINE_MAX_S else COARSE_RESOLUTION_S
    # The bucket starts, not a time range: 10 s points exist only for the last day, so to PostgreSQL's
    # per-column statistics a range looks ~30x wider than it is for 5 min points, and it scans the
    # whole table. A list of instants is estimated right and read through the (resolution, time) index.
    rows = _region_sums(base.filter(resolution_s=resolution_s, time__in=_bucket_starts(since, now, resolution_s)))
    latest_resolution_s = resolution_s
    width_s = {r["time"]: resolution_s for r in rows}
    if resolution_s == COARSE_RESOLUTION_S:
        # The newest minutes are not downsampled yet: show them at the fine resolution.
        tail_from = rows[-1]["time"] + timedelta(seconds=COARSE_RESOLUTION_S) if rows else since
        tail = _region_sums(base.filter(resolution_s=FINE_RESOLUTION_S, time__gte=tail_from, time__lte=now))
        latest_resolution_s = FINE_RESOLUTION_S if tail else COARSE_RESOLUTION_S
        width_s |= {r["time"]: FINE_RESOLUTION_S for r in tail}
        rows += tail

    capacity_now: dict[str, dict[str, Any]] = {
        row["region"]: row for row in CapacityState.objects.visible_to(principal).values("region")
        .annotate(capacity_sum=Sum("capacity"), unlimited=Count("pk", filter=Q(capacity__isnull=True)),
                  healthy=Sum("healthy_members"))
    }
    times = sorted({r["time"] for r in rows})
    regions = sorted({r["region"] for r in rows} | set(capacity_now))
    index = {t: i for i, t in enumerate(times)}
    series: dict[str, dict[str, list[float | None]]] = {
        region: {key: [0.0] * len(times) for key in ("demand", "local", "out", "in")}
        | {"capacity": [None] * len(times)} for region in regions
    }
    sums: dict[str, dict[str, float]] = {r: defaultdict(float) for r in regions}
    latest: dict[str, dict[str, Any]] = {}
    for r in rows:
        values = {"demand": r["demand_sum"] or 0.0, "local": r["local_sum"] or 0.0, "out": r["out_sum"] or 0.0,
                  "in": r["in_sum"] or 0.0}
        column, i = series[r["region"]], index[r["time"]]
        for key, value in values.items():
            column[key][i] = round(value, 3)
            sums[r["region"]][key] += value * width_s[r["time"]]
        column["capacity"][i] = None if r["capacity_sum"] is None else round(r["capacity_sum"], 3)
        if r["time"] == times[-1]:
            latest[r["region"]] = values | {"capacity": r["capacity_sum"], "unlimited": r["unlimited"]}

    # A time-weighted mean: the fine tail's 10 s buckets must not count like 5 min ones.
    span_s = sum(width_s[t] for t in times) or 1
    summary = []
    for region in regions:
        state = capacity_now.get(region) or latest.get(region) or {}
        capacity = state.get("capacity_sum", state.get("capacity"))
        now_row = latest.get(region, {})
        local, inflow = now_row.get("local", 0.0), now_row.get("in", 0.0)
        summary.append({
            "region": region,
            "capacity": None if capacity is None else round(capacity, 3),
            "unlimited_pools": state.get("unlimited", 0),
            "healthy_members": state.get("healthy"),
            **{key: round(now_row.get(key, 0.0), 3) for key in ("demand", "local", "out", "in")},
            "utilization": round((local + inflow) / capacity, 4) if capacity else 0.0,
            "mean": {key: round(sums[region][key] / span_s, 3) for key in ("demand", "local", "out", "in")},
        })
    top: list[OverflowPoint] = []
    if times:
        top = list(base.filter(time=times[-1], resolution_s=latest_resolution_s, out__gt=0)
                   .select_related("pool__lb").order_by("-out")[:TOP_OVERFLOWING])
    return {
        "window_s": window_s, "resolution_s": resolution_s, "buckets": len(times),
        "latest_time": times[-1] if times else None, "regions": summary, "top": top,
        "series": {"time": [int(t.timestamp()) for t in times], "regions": series, "resolution_s": resolution_s},
    }


__all__ = [
    "distances",
    "flow_to_dict",
    "member_health",
    "node_chains",
    "observed_overflow",
    "parse_window",
    "pool_capacities",
    "pool_capacities_many",
    "pool_overview",
    "region_overflow",
]
