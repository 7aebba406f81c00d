"""Failover drills: prove on the real fleet that the other regions absorb a region's traffic.

A drill drains `share` of one region of a pool (1.0: all of it; less lowers the region's traffic dial)
for `duration_s`, optionally while a capacity test drives the expected peak at the pool, and samples the
nodes' own counters every second (`fleets.selectors.pool_counters`): what each region served, what
arrived, what failed. Phases: `baseline` (BASELINE_S before the drain), `drained`, `restored` (AFTER_S
after it). It fails, and restores at once, when

- `error_rate`: over the last ERROR_WINDOW samples, failed requests / arrived (the nodes' count: 5xx and
  connection errors at the members plus requests answered without a member, such as a shed 503; with a
  capacity test, its clients' own count when that is worse) exceed the drill's `slo_error_rate`;
- `p99`: a step of the capacity test that ended while drained measured a p99 above `slo_p99_ms`;
- `over_capacity`: a region served more than OVER_CAPACITY x its capacity for OVER_CAPACITY_SAMPLES
  seconds in a row (the neighbours could not take it within the pool's capacities);
- `nodes_unreachable`: the nodes could not be read for UNREACHABLE_SAMPLES seconds (nothing to judge by).

The drain is a lease: an entry in the cache that the enforcement loop reads 4 times a second, which the
drill renews every second with DRAIN_LEASE_S to live. A drill whose worker dies (or loses the cache) leaves
no region drained for more than DRAIN_LEASE_S; the reaper then fails it as lost, with an event.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Final

from django.utils import timezone

from apps.capacity import services as capacity_services
from apps.capacity.models import CapacityRun, Drill, StepResult
from apps.core.errors import DomainError
from apps.events.services import event_emit
from apps.fleets.selectors import NodeCounters, pool_counters
from apps.traffic import services as traffic_services
from apps.traffic.selectors import pool_capacities, pool_steering_now

logger = logging.getLogger(__name__)

SAMPLE_S: Final = 1.0
BASELINE_S: Final = 3
AFTER_S: Final = 2
ERROR_WINDOW: Final = 3  # samples
OVER_CAPACITY: Final = 1.10
OVER_CAPACITY_SAMPLES: Final = 3
UNREACHABLE_SAMPLES: Final = 5
TEST_START_WAIT_S: Final = 30.0
SETTLED_WITHIN: Final = 0.05  # react_s: the drained region is within 5% of the demand of its target
DRAIN_LEASE_S: Final = 5.0

Counters = Mapping[str, NodeCounters]


# --- pure: rates, checks, the summary --------------------------------------------------------------


def rates(before: Counters, after: Counters, seconds: float) -> dict[str, Any]:
    """Per-second rates between two readings: served per region, arrived, failed at a member, and unanswered
    (answered by the node without a member: shed). A node counts its shed answers itself; for one whose config
    predates that count, unanswered is inferred as arrived minus sent to a member, where a request between the
    two at a reading counts here and back in the next interval (it may be negative, and only a window's sum is
    clamped). Nodes in both readings only; a counter that went backwards restarted, and counts from zero."""
    served: dict[str, float] = {}
    arrived = failed = unanswered = 0.0
    for node, now in after.items():
        then = before.get(node)
        if then is None:
            continue

        def delta(new: int, old: int) -> int:
            return new - old if new >= old else new

        node_served = 0
        for region, count in now.served.items():
            d = delta(count, then.served.get(region, 0))
            served[region] = served.get(region, 0.0) + d
            node_served += d
            failed += delta(now.failed.get(region, 0), then.failed.get(region, 0))
        node_arrived = delta(now.arrived, then.arrived)
        arrived += node_arrived
        if now.shed is not None and then.shed is not None:
            unanswered += delta(now.shed, then.shed)
        else:
            unanswered += node_arrived - node_served
    span = max(seconds, 1e-6)
    return {"served": {r: round(v / span, 2) for r, v in sorted(served.items())},
            "arrived": round(arrived / span, 2), "failed": round(failed / span, 2),
            "unanswered": round(unanswered / span, 2),
            "errors": round((failed + max(0.0, unanswered)) / span, 2)}


def window_errors(samples: list[dict[str, Any]]) -> float:
    """Failed requests over consecutive samples: member failures, plus what arrived and no member took over the
    whole window (a request waiting at one reading and served by the next counts nowhere)."""
    return sum(s.get("failed", s["errors"]) for s in samples) + max(0.0, sum(s.get("unanswered", 0.0) for s in samples))


def check(drill: Drill, samples: list[dict[str, Any]], client: dict[str, Any] | None = None) -> tuple[str, str] | None:
    """(code, reason) when the drill has broken a check in its drained phase, else None (module docstring)."""
    drained = [s for s in samples if s["phase"] == "drained"]
    if not drained:
        return None
    recent = drained[-ERROR_WINDOW:]
    arrived = sum(s["arrived"] for s in recent)
    errors = window_errors(recent)
    rate = errors / arrived if arrived else 0.0
    if client and client.get("sent"):
        rate = max(rate, client["errors"] / client["sent"])
    if len(recent) == ERROR_WINDOW and rate > drill.slo_error_rate:
        return "error_rate", (f"{rate:.1%} of requests failed over the last {ERROR_WINDOW} s "
                              f"(the drill allows {drill.slo_error_rate:.1%})")
    p99 = drained[-1].get("p99_ms")
    if drill.slo_p99_ms is not None and p99 is not None and p99 > drill.slo_p99_ms:
        return "p99", (f"p99 latency {p99:.0f} ms in the capacity test's last step "
                       f"(the drill allows {drill.slo_p99_ms:.0f} ms)")
    for region in drained[-1]["served"]:
        tail = drained[-OVER_CAPACITY_SAMPLES:]
        caps = [s["capacity"].get(region) for s in tail]
        if len(tail) == OVER_CAPACITY_SAMPLES and all(
                c is not None and s["served"].get(region, 0.0) > c * OVER_CAPACITY + 1.0
                for s, c in zip(tail, caps, strict=True)):
            return "over_capacity", (f"{region} served {tail[-1]['served'][region]:.0f} req/s for "
                                     f"{OVER_CAPACITY_SAMPLES} s, over its capacity of {caps[-1]:.0f} req/s")
    unreachable = drained[-UNREACHABLE_SAMPLES:]
    if len(unreachable) == UNREACHABLE_SAMPLES and all(s.get("unreachable") for s in unreachable):
        missing = ", ".join(unreachable[-1]["unreachable"])
        return "nodes_unreachable", f"nodes did not answer for {UNREACHABLE_SAMPLES} s: {missing}"
    return None


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 2) if values else 0.0


def summarize(drill: Drill, samples: list[dict[str, Any]]) -> dict[str, Any]:
    """What moved where and how fast: mean served per region before and while drained, the change, the
    seconds until the drained region was at its target, peak utilization per region, worst error rate."""
    region = drill.region.slug
    regions = sorted({r for s in samples for r in s["served"]})
    before = [s for s in samples if s["phase"] == "baseline"]
    during = [s for s in samples if s["phase"] == "drained"]
    out: dict[str, Any] = {"region": region, "share": drill.share, "regions": regions}
    out["before"] = {r: _mean([s["served"].get(r, 0.0) for s in before]) for r in regions}
    base_own = out["before"].get(region, 0.0)
    target = base_own * (1.0 - drill.share)
    react = None
    for s in during:
        total = sum(s["served"].values()) or 1.0
        if abs(s["served"].get(region, 0.0) - target) <= SETTLED_WITHIN * total:
            react = round(s["t"] - during[0]["t"] + SAMPLE_S, 2)  # the sample covers the second before it
            break
    settled = [s for s in during if react is not None and s["t"] - during[0]["t"] + SAMPLE_S >= react]
    out["during"] = {r: _mean([s["served"].get(r, 0.0) for s in settled]) for r in regions}
    out["moved"] = {r: round(out["during"][r] - out["before"][r], 2) for r in regions}
    out["react_s"] = react
    peak: dict[str, float | None] = {}
    for r in regions:
        utils = [s["served"].get(r, 0.0) / s["capacity"][r] for s in during
                 if s["capacity"].get(r) not in (None, 0)]
        peak[r] = round(max(utils), 3) if utils else None
    out["peak_utilization"] = peak
    out["max_error_rate"] = max((s["error_rate"] for s in during), default=0.0)
    p99s = [s["p99_ms"] for s in during if s.get("p99_ms") is not None]
    out["max_p99_ms"] = max(p99s) if p99s else None
    return out


def describe(summary: Mapping[str, Any]) -> str:
    moved = summary.get("moved", {})
    gained = ", ".join(f"{r} +{v:.0f}" for r, v in moved.items() if v > 0) or "nothing moved"
    react = summary.get("react_s")
    return f"{gained} req/s" + (f", in {react:.0f} s" if react is not None else "")


# --- the run ------------------------------------------------------------------------------------------


def _capacities(drill: Drill) -> dict[str, float | None]:
    """Each region's capacity now as the enforcer uses it (req/s, health-aware, with the pool's steering in force:
    dials, the loop's drains, this drill's drain); None = unlimited."""
    steering = pool_steering_now(drill.pool)
    effective = steering.effective({cap.region: cap.capacity for cap in pool_capacities(drill.pool)})
    return {region: None if math.isinf(value) else round(value, 2) for region, value in effective.items()}


def _client(run: CapacityRun | None, since: dict[str, int]) -> tuple[dict[str, Any] | None, float | None]:
    """The capacity run's clients since the last sample (sent, errors), and the p99 of its newest step."""
    if run is None:
        return None, None
    run.refresh_from_db(fields=["sent", "errors", "status"])
    client = {"sent": run.sent - since.get("sent", 0), "errors": run.errors - since.get("errors", 0)}
    since.update(sent=run.sent, errors=run.errors)
    step = StepResult.objects.filter(run=run, shard__isnull=True).order_by("-index").first()
    return client, (round(step.p99_ms, 1) if step is not None else None)


def _wait_for_load(drill: Drill, run: CapacityRun, cancelled: Callable[[], bool]) -> None:
    deadline = time.monotonic() + TEST_START_WAIT_S
    while time.monotonic() < deadline and not cancelled():
        run.refresh_from_db(fields=["status", "start_at", "error"])
        if run.status not in CapacityRun.ACTIVE:
            raise DomainError("test_failed",
                              f"The capacity test's run ended before the drill: {run.error or run.status}.")
        if run.status == CapacityRun.Status.RUNNING and run.start_at and run.start_at <= timezone.now():
            return
        time.sleep(0.2)
    raise DomainError("test_not_started", f"The capacity test's run did not start within {TEST_START_WAIT_S:.0f} s.")


class _Sampler:
    def __init__(self, drill: Drill, run: CapacityRun | None) -> None:
        self.drill = drill
        self.run = run
        self.samples: list[dict[str, Any]] = []
        self.started = time.monotonic()
        self.counters, _ = pool_counters(drill.pool)
        self.at = time.monotonic()
        self.client_since: dict[str, int] = {}
        self.client: dict[str, Any] | None = None
        if run is not None:
            self._client_tick()

    def _client_tick(self) -> None:
        self.client, p99 = _client(self.run, self.client_since)
        self.p99 = p99

    def take(self) -> dict[str, Any]:
        counters, missing = pool_counters(self.drill.pool)
        now = time.monotonic()
        sample = {"t": round(now - self.started, 2), "phase": self.drill.phase,
                  **rates(self.counters, counters, now - self.at), "capacity": _capacities(self.drill)}
        window = [*self.samples[-(ERROR_WINDOW - 1):], sample]  # the rate the check judges: over the last 3 s
        arrived = sum(s["arrived"] for s in window)
        sample["error_rate"] = round(window_errors(window) / arrived, 4) if arrived else 0.0
        if missing:
            sample["unreachable"] = missing
        self.p99 = None
        if self.run is not None:
            self._client_tick()
        sample["p99_ms"] = self.p99
        self.counters, self.at = counters, now
        self.samples.append(sample)
        Drill.objects.filter(pk=self.drill.pk).update(samples=self.samples, phase=self.drill.phase,
                                                      updated_at=timezone.now())
        return sample

    def every_second(self, seconds: float, stop: Callable[[], str | None]) -> str | None:
        """Sample each second for `seconds`; the first reason `stop` gives ends it early."""
        end = time.monotonic() + seconds
        while time.monotonic() < end - 0.05:
            time.sleep(max(0.0, min(SAMPLE_S - (time.monotonic() - self.at), end - time.monotonic())))
            self.take()
            if (why := stop()) is not None:
                return why
        return None


class _Stopped(Exception):
    """The drill was cancelled before its drain began."""


def _cancelled(drill_id: int) -> bool:
    return Drill.objects.filter(pk=drill_id, status=Drill.Status.CANCELLED).exists()


def drill_execute(drill_id: int) -> str:
    """Run a pending drill to its end (the Celery task's body). Idempotent: a drill not pending is skipped."""
    now = timezone.now()
    if not Drill.objects.filter(pk=drill_id, status=Drill.Status.PENDING).update(
            status=Drill.Status.RUNNING, started_at=now, phase="starting"):
        return "skipped"
    drill = Drill.objects.select_related("pool__org", "pool__lb", "region", "test").get(pk=drill_id)
    run: CapacityRun | None = None
    failed: tuple[str, str] | None = None
    sampler: _Sampler | None = None
    try:
        if drill.test is not None:
            run = capacity_services.capacity_run_start(principal=None, test=drill.test, for_drill=True)
            Drill.objects.filter(pk=drill.pk).update(capacity_run=run)
            _wait_for_load(drill, run, lambda: _cancelled(drill_id))
        drill.phase = "baseline"
        sampler = _Sampler(drill, run)
        if sampler.every_second(BASELINE_S, lambda: "cancelled" if _cancelled(drill_id) else None):
            raise _Stopped  # cancelled before the drain: nothing to restore

        def drain() -> None:
            traffic_services.drill_drain(pool_id=drill.pool_id, region=drill.region.slug, share=drill.share,
                                         ttl_s=DRAIN_LEASE_S)

        drain()
        drill.phase = "drained"
        Drill.objects.filter(pk=drill.pk).update(phase="drained", drained_at=timezone.now())
        event_emit("drill.started", org=drill.pool.org, obj=drill.pool,
                   data={"drill": drill.pk, "region": drill.region.slug, "share_pct": round(drill.share * 100),
                         "duration_s": drill.duration_s})

        def stop() -> str | None:
            nonlocal failed
            if _cancelled(drill_id):
                return "cancelled"
            drain()  # renew the lease
            failed = check(drill, sampler.samples, sampler.client)  # type: ignore[union-attr]
            return failed[0] if failed else None

        sampler.every_second(drill.duration_s, stop)
    except DomainError as exc:
        failed = (exc.code, exc.detail)
    except _Stopped:
        pass
    finally:
        traffic_services.drill_restore(pool_id=drill.pool_id)  # whatever happened above
    drill.phase = "restored"
    Drill.objects.filter(pk=drill.pk).update(restored_at=timezone.now(), phase="restored")
    if sampler is not None and not _cancelled(drill_id):
        sampler.every_second(AFTER_S, lambda: None)
    if run is not None:
        with contextlib.suppress(DomainError):  # it finished by itself
            capacity_services.capacity_run_cancel(principal=None, run=run)
    samples = sampler.samples if sampler is not None else []
    summary = summarize(drill, samples) if samples else {}
    if _cancelled(drill_id):
        Drill.objects.filter(pk=drill.pk).update(summary=summary, finished_at=timezone.now(), phase="done")
        return "cancelled"
    status = Drill.Status.FAILED if failed else Drill.Status.PASSED
    Drill.objects.filter(pk=drill.pk, status=Drill.Status.RUNNING).update(
        status=status, summary=summary, phase="done", finished_at=timezone.now(),
        failed_check=failed[0] if failed else "", reason=failed[1] if failed else "")
    if failed:
        event_emit("drill.failed", org=drill.pool.org, obj=drill.pool,
                   data={"drill": drill.pk, "region": drill.region.slug, "check": failed[0], "reason": failed[1]})
    else:
        event_emit("drill.passed", org=drill.pool.org, obj=drill.pool,
                   data={"drill": drill.pk, "region": drill.region.slug, "summary": describe(summary),
                         "react_s": summary.get("react_s")})
    return str(status)


def reap_lost_drills(*, stale_s: float = 60.0) -> int:
    """Drills whose worker stopped sampling: failed, with an event (their drain expired by itself within
    DRAIN_LEASE_S of the last renewal)."""
    cutoff = timezone.now() - timedelta(seconds=stale_s)
    reason = f"The drill's worker stopped; its drain expired by itself within {DRAIN_LEASE_S:.0f} s."
    lost = 0
    for drill in Drill.objects.filter(status=Drill.Status.RUNNING, updated_at__lt=cutoff).select_related(
            "pool__org", "region"):
        if Drill.objects.filter(pk=drill.pk, status=Drill.Status.RUNNING).update(
                status=Drill.Status.FAILED, failed_check="lost", phase="done", finished_at=timezone.now(),
                reason=reason):
            lost += 1
            event_emit("drill.failed", org=drill.pool.org, obj=drill.pool,
                       data={"drill": drill.pk, "region": drill.region.slug, "check": "lost", "reason": reason})
    return lost
