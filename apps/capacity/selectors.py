"""Reads for capacity tests and runs: what a tenant may target, live progress, chart data."""

from __future__ import annotations

from typing import Any

from django.db.models import Q, QuerySet

from apps.balancers.models import Listener, Member, PoolRegion
from apps.capacity.models import CapacityRun, CapacityShard, CapacityTest, StepResult
from apps.capacity.safety import Load


def targetable_listeners(principal) -> QuerySet[Listener]:
    """Listeners a principal may pick as a target: its own LBs', and shared LBs' (hostname checked later)."""
    qs = Listener.objects.select_related("lb", "static_ip")
    if principal.is_operator:
        return qs
    return qs.filter(Q(lb__org_id=principal.org_id) | Q(lb__shared=True))


def org_active_load(*, org_id: int, exclude_run_id: int | None = None) -> list[Load]:
    """What the org's runs already in flight take from its caps."""
    runs = CapacityRun.objects.filter(test__org_id=org_id, status__in=CapacityRun.ACTIVE)
    if exclude_run_id is not None:
        runs = runs.exclude(pk=exclude_run_id)
    return [Load(peak_rate=r.peak_rate, schedule_s=0.0, concurrency=r.concurrency) for r in runs]


def pool_region_for(test: CapacityTest) -> PoolRegion | None:
    """The PoolRegion a recommendation would change: the test's pool in the test's region, else the
    region of the fleet serving the listener, else the pool's only region."""
    if test.pool_id is None:
        return None
    regions = PoolRegion.objects.filter(pool_id=test.pool_id).select_related("pool", "region")
    if test.region_id is not None:
        return regions.filter(region_id=test.region_id).first()
    listener = test.listener
    fleet = listener.lb.fleet if listener is not None else None
    if fleet is not None:
        found = regions.filter(region_id=fleet.region_id).first()
        if found is not None:
            return found
    only = list(regions[:2])
    return only[0] if len(only) == 1 else None


def healthy_member_count(pool_region: PoolRegion) -> int:
    """Members that share the measured load: in the pool's region and administratively active.

    Live health from the fleets' checks is not consulted yet: an active member is counted as healthy.
    """
    return Member.objects.filter(pool_id=pool_region.pool_id, region_id=pool_region.region_id,
                                 admin_state=Member.AdminState.ACTIVE).count()


def run_steps(run: CapacityRun, *, merged: bool = True) -> QuerySet[StepResult]:
    qs = StepResult.objects.filter(run=run)
    return qs.filter(shard__isnull=True) if merged else qs.filter(shard__isnull=False)


def run_progress(run: CapacityRun) -> dict[str, Any]:
    """Live progress, as the API and the UI's progress bar show it."""
    shards = list(CapacityShard.objects.filter(run=run).values(
        "index", "status", "percent", "current_step", "achieved_rate", "sent", "ok", "errors", "worker",
        "stopped_reason", "start_skew_s"))
    return {
        "id": run.pk,
        "status": run.status,
        "progress_percent": round(run.progress_percent, 1),
        "current_step": run.current_step,
        "step_count": run.step_count,
        "achieved_rate": round(run.achieved_rate, 1),
        "sent": run.sent,
        "ok": run.ok,
        "errors": run.errors,
        "stopped_reason": run.stopped_reason,
        "error_code": run.error_code,
        "error": run.error,
        "started_at": run.started_at,
        "finished_at": run.finished_at,
        "shards": shards,
    }


def run_chart(run: CapacityRun) -> dict[str, Any]:
    """Latency against offered rate (p50, p99) and errors per step, plus the knee, for uPlot."""
    steps = list(run_steps(run).order_by("index"))
    return {
        "run": run.pk,
        "label": f"run #{run.pk}",
        "offered_rate": [round(s.offered_rate, 1) for s in steps],
        "achieved_rate": [round(s.achieved_rate, 1) for s in steps],
        "p50_ms": [s.p50_ms for s in steps],
        "p99_ms": [s.p99_ms for s in steps],
        "errors": [s.error_count for s in steps],
        "ok": [s.ok for s in steps],
        "knee_index": run.knee_step_index,
        "knee_capacity_rps": run.knee_capacity_rps,
        "slo_p99_ms": run.test.slo_p99_ms,
    }


def _rate(value: float | None) -> str:
    return "unlimited" if value is None or value == float("inf") else f"{value:.1f} req/s"


def apply_preview(run: CapacityRun) -> dict[str, Any] | None:
    """What applying the run's recommendation changes, before anyone confirms it: the pool region's
    max_rate_per_member and capacity before and after, and where the last five minutes' demand would be served
    now and then (traffic.overflow.plan, the planner the overflow page uses). None: nothing to apply."""
    from dataclasses import replace

    from apps.traffic.overflow import plan
    from apps.traffic.selectors import distances, observed_overflow, pool_capacities

    pool_region = run.pool_region
    if run.recommended_max_rate_per_member is None or pool_region is None:
        return None
    region = pool_region.region.slug
    now_caps = pool_capacities(pool_region.pool)
    after_caps = [replace(c, max_rate_per_member=run.recommended_max_rate_per_member) if c.region == region else c
                  for c in now_caps]
    before_cap = next((c.capacity for c in now_caps if c.region == region), 0.0)
    after_cap = next((c.capacity for c in after_caps if c.region == region), 0.0)
    seen = observed_overflow(pool_region.pool, 300)
    demand = {row["region"]: float(row.get("demand") or 0.0) for row in seen["regions"]}
    lines = []
    if sum(demand.values()) <= 0:
        lines.append("No traffic reached this pool in the last 5 minutes: nothing moves now; the new capacity "
                     "applies to the next requests.")
    else:
        dist = distances()
        now_flow, then_flow = plan(demand, now_caps, dist).flow(region), plan(demand, after_caps, dist).flow(region)
        shown = ", ".join(f"{r} {v:.1f} req/s" for r, v in sorted(demand.items()) if v > 0)
        lines.append(f"At the last 5 minutes' demand ({shown}):")
        for label, flow in (("now", now_flow), ("after", then_flow)):
            out = ", ".join(f"{v:.1f} to {dst}" for dst, v in sorted(flow.out_to.items())) or "nothing out"
            lines.append(f"{label}: {region} serves {flow.local:.1f} req/s of its own and {flow.in_:.1f} from "
                         f"elsewhere, sends {out}" + (f", {flow.unserved:.1f} served nowhere" if flow.unserved
                                                      else "") + ".")
    return {"region": region, "pool_region": pool_region, "members": healthy_member_count(pool_region),
            "rate_before": _rate(pool_region.max_rate_per_member),
            "rate_after": _rate(run.recommended_max_rate_per_member),
            "capacity_before": _rate(before_cap), "capacity_after": _rate(after_cap),
            "scaler": pool_region.capacity_scaler,
            "lines": lines}


def drill_chart(drill) -> dict[str, Any]:
    """A drill's seconds for uPlot: served req/s and capacity per region, error rate and p99, the drained span."""
    samples = drill.samples or []
    regions = sorted({r for s in samples for r in s["served"]})
    drained = [s["t"] for s in samples if s["phase"] == "drained"]
    return {
        "drill": drill.pk,
        "t": [s["t"] for s in samples],
        "regions": regions,
        "served": {r: [s["served"].get(r, 0.0) for s in samples] for r in regions},
        "capacity": {r: [s["capacity"].get(r) for s in samples] for r in regions},
        "error_rate": [round(100 * s["error_rate"], 2) for s in samples],
        "p99_ms": [s.get("p99_ms") for s in samples],
        # The drained span: from the sample before the first drained one (the drain began within that second).
        "drained": [max(0.0, drained[0] - 1.0), drained[-1]] if drained else None,
        "region": drill.region.slug,
        "slo_error_rate_pct": round(100 * drill.slo_error_rate, 2),
    }


def drill_rows(drill) -> list[dict[str, Any]]:
    """The report's table: per region, before / during / moved, capacity while drained and peak utilization."""
    summary = drill.summary or {}
    last_drained = next((s for s in reversed(drill.samples or []) if s["phase"] == "drained"), None)
    rows = []
    for region in summary.get("regions", []):
        capacity = last_drained["capacity"].get(region) if last_drained else None
        peak = summary.get("peak_utilization", {}).get(region)
        rows.append({"region": region, "drained": region == summary.get("region"),
                     "before": summary["before"].get(region), "during": summary["during"].get(region),
                     "moved": summary["moved"].get(region), "capacity": capacity,
                     "peak_pct": None if peak is None else round(100 * peak)})
    return rows
