"""Running a capacity run on Celery workers: prepare, run shards side by side, merge, find the knee.

`run_prepare` (start task) freezes the plan and the resolved target, then enqueues one shard task
per share. Each `shard_execute` claims its shard row with a conditional UPDATE (a redelivered
message never offers the load twice), waits for the common start instant, runs the engine with a
monitor thread beside it, and stores its step results. The last shard to finish (a counter on the
run row, under a row lock) merges the histograms exactly, runs knee detection and computes the
recommendation.

The monitor thread keeps all database I/O off the engine's event loop: it polls the run row every
0.2 s (cancel, caps lowered, duration and rate caps) and sets the engine's cancel event; it writes
this shard's progress at most every 0.5 s and the run's aggregate at most ~2/s across all shards.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import F, Q, Sum
from django.utils import timezone

from apps.capacity import engine, knee, safety
from apps.capacity.models import CapacityRun, CapacityShard, CapacityTest, StepResult
from apps.capacity.rules import caps_of, load_of, plan_for
from apps.capacity.selectors import healthy_member_count, org_active_load, pool_region_for
from apps.core.errors import DomainError
from apps.events.services import event_emit
from apps.fleets.services import enforce, overflow_hold, overflow_release

log = logging.getLogger(__name__)

# Shards wait until this long after the start task ran, so that all of them (on different
# workers) begin offering load at the same instant and their steps line up.
START_LEAD_S = 1.0
MONITOR_INTERVAL_S = 0.2
PROGRESS_INTERVAL_S = 0.5
# A run whose shards have not all reported this long after their plan's own deadline is failed;
# a run no worker picked up at all, this long after it was requested.
STALE_GRACE_S = 60.0
PENDING_GRACE_S = 600.0

Enqueue = Callable[[int, int, float], None]


def _now():
    return timezone.now()


def _fail_run(run_id: int, code: str, message: str) -> bool:
    return bool(CapacityRun.objects.filter(pk=run_id, status__in=CapacityRun.ACTIVE).update(
        status=CapacityRun.Status.FAILED, error_code=code, error=message[:2000], finished_at=_now()))


# --- start -----------------------------------------------------------------------------------


def run_prepare(run_id: int, enqueue: Enqueue) -> str:
    """Pending -> running: re-check, freeze the plan, create shard rows, enqueue shards."""
    run = CapacityRun.objects.select_related("test__org").filter(pk=run_id).first()
    if run is None or run.status != CapacityRun.Status.PENDING:
        return "skipped"
    test: CapacityTest = run.test
    try:
        target = safety.target_resolve(test=test)
        safety.check_caps(load_of(test), caps_of(test.org))
        safety.check_budget(load_of(test), org_active_load(org_id=test.org_id, exclude_run_id=run.pk),
                            caps_of(test.org))
        plan = plan_for(test, target)
    except DomainError as exc:
        _fail_run(run.pk, exc.code, exc.detail)
        return exc.code
    shards = max(1, min(run.shards_total, len(engine.split_plan(plan, run.shards_total))))
    start_at = _now() + timedelta(seconds=START_LEAD_S)
    with transaction.atomic():
        claimed = CapacityRun.objects.filter(pk=run.pk, status=CapacityRun.Status.PENDING).update(
            status=CapacityRun.Status.RUNNING, plan=plan.to_dict(), target_address=target.address,
            target_host_header=target.host_header, shards_total=shards, shards_done=0, started_at=_now(),
            start_at=start_at, step_count=len(plan.steps))
        if not claimed:
            return "skipped"
        for index in range(shards):
            CapacityShard.objects.get_or_create(run_id=run.pk, index=index)
        time_limit_s = START_LEAD_S + plan.max_duration_s + 30.0
        transaction.on_commit(lambda: [enqueue(run.pk, i, time_limit_s) for i in range(shards)])
    pool_region = None if run.for_drill else pool_region_for(test)  # a drill measures the overflow itself
    if pool_region is not None:
        CapacityRun.objects.filter(pk=run.pk).update(pool_counters_start=_pool_counters(pool_region))
        overflow_hold(pool_region.pool_id, pool_region.region.slug, START_LEAD_S + plan.max_duration_s + 5.0)
        # Set the held limits on the nodes now, before the shards start, rather than at the loop's next
        # run: the shards may take every worker slot (`make run`: 2 slots, the demo test: 2 shards), and
        # then the beat's enforce_task expires unrun for the whole test, which measured the tested
        # region plus its overflow.
        enforce(lb_ids=[pool_region.pool.lb_id])
    return "started"


# --- one shard -------------------------------------------------------------------------------


class ShardMonitor(threading.Thread):
    """Watches the run row beside the engine; the engine only ever reads `cancel` (an Event)."""

    def __init__(self, run: CapacityRun, shard: CapacityShard, plan: engine.LoadPlan) -> None:
        super().__init__(name=f"capacity-monitor-{run.pk}-{shard.index}", daemon=True)
        self.run_id = run.pk
        self.shard_id = shard.pk
        self.cancel = threading.Event()
        self.finished = threading.Event()
        self.latest: engine.Progress | None = None
        self.written: engine.Progress | None = None
        self.last_write_t = 0.0
        self.started_t = time.monotonic()
        self.rate_samples: list[float] = []
        self.load = safety.Load(peak_rate=run.peak_rate, schedule_s=plan.schedule_s,
                                concurrency=run.concurrency)
        self.drain_allowance_s = max(plan.max_duration_s - plan.schedule_s, 0.0) + START_LEAD_S + 1.0

    def on_progress(self, progress: engine.Progress) -> None:
        # Called in the engine's loop thread: hand over and return at once.
        self.latest = progress

    def run(self) -> None:
        try:
            while not self.finished.wait(MONITOR_INTERVAL_S):
                try:
                    self.poll()
                except Exception:
                    log.exception("capacity monitor poll failed")
        finally:
            connection.close()

    def stop(self) -> None:
        self.finished.set()
        self.join(timeout=5)

    def poll(self) -> None:
        row = (CapacityRun.objects.filter(pk=self.run_id)
               .values("status", "test__org__max_test_rate", "test__org__max_test_duration_s",
                       "test__org__max_test_concurrency").first())
        if row is None or row["status"] != CapacityRun.Status.RUNNING:
            self.cancel.set()
            return
        now_t = time.monotonic()
        progress = self.latest
        if progress is not None and progress is not self.written and now_t - self.last_write_t >= PROGRESS_INTERVAL_S:
            self._write_progress(progress)
            self.written, self.last_write_t = progress, now_t
            total = CapacityShard.objects.filter(run_id=self.run_id, status=CapacityShard.Status.RUNNING).aggregate(
                rate=Sum("achieved_rate"))["rate"] or 0.0
            self.rate_samples = [*self.rate_samples[-4:], float(total)]
        caps = safety.Caps(max_rate=float(row["test__org__max_test_rate"]),
                           max_duration_s=float(row["test__org__max_test_duration_s"]),
                           max_concurrency=int(row["test__org__max_test_concurrency"]))
        why = safety.running_violation(load=self.load, caps=caps, elapsed_s=now_t - self.started_t,
                                       drain_allowance_s=self.drain_allowance_s, achieved_rates=self.rate_samples)
        if why is not None:
            if _fail_run(self.run_id, safety.CAP_EXCEEDED, f"Stopped: {why}."):
                CapacityRun.objects.filter(pk=self.run_id).update(stopped_reason=safety.CAP_EXCEEDED)
            self.cancel.set()

    def _write_progress(self, p: engine.Progress) -> None:
        CapacityShard.objects.filter(pk=self.shard_id).update(
            percent=p.percent, current_step=p.step_index, achieved_rate=p.achieved_rate, sent=p.sent, ok=p.ok,
            errors=p.errors)
        write_run_progress(self.run_id)


def write_run_progress(run_id: int, *, force: bool = False) -> None:
    """Aggregate the shards into the run row, at most every ~0.5 s whoever calls (conditional UPDATE)."""
    shards = list(CapacityShard.objects.filter(run_id=run_id).values(
        "status", "percent", "current_step", "achieved_rate", "sent", "ok", "errors"))
    if not shards:
        return
    running = [s for s in shards if s["status"] == CapacityShard.Status.RUNNING]
    now = _now()
    qs = CapacityRun.objects.filter(pk=run_id)
    if not force:
        qs = qs.filter(Q(progress_at__isnull=True) | Q(progress_at__lte=now - timedelta(seconds=0.45)))
    qs.update(
        progress_percent=sum(s["percent"] for s in shards) / len(shards),
        current_step=min((s["current_step"] for s in running), default=max(s["current_step"] for s in shards)),
        achieved_rate=round(sum(s["achieved_rate"] for s in running), 1),
        sent=sum(s["sent"] for s in shards), ok=sum(s["ok"] for s in shards),
        errors=sum(s["errors"] for s in shards), progress_at=now)


def _wait_until(start_at, monitor_cancel: Callable[[], bool]) -> None:
    while True:
        remaining = (start_at - _now()).total_seconds()
        if remaining <= 0 or monitor_cancel():
            return
        time.sleep(min(remaining, 0.05))


def shard_execute(run_id: int, index: int, worker: str = "") -> str:
    """Run one shard's share of the plan and store its step results; the last shard finalizes."""
    claimed = CapacityShard.objects.filter(run_id=run_id, index=index, status=CapacityShard.Status.PENDING).update(
        status=CapacityShard.Status.RUNNING, worker=worker[:200], started_at=_now())
    if not claimed:
        shard = CapacityShard.objects.filter(run_id=run_id, index=index).first()
        if shard is not None and shard.status == CapacityShard.Status.RUNNING:
            # Redelivered after the worker died mid-run: offering the load again, late and alone,
            # would measure something else. Record the loss instead.
            _shard_done(shard.pk, CapacityShard.Status.LOST, stopped_reason="lost",
                        error="the worker running this shard was lost")
            return shard_finished(run_id)
        return "skipped"
    run = CapacityRun.objects.select_related("test__org").get(pk=run_id)
    shard = CapacityShard.objects.get(run_id=run_id, index=index)
    if run.status != CapacityRun.Status.RUNNING or not run.plan:
        _shard_done(shard.pk, CapacityShard.Status.DONE, stopped_reason="cancelled")
        return shard_finished(run_id)
    plan = engine.split_plan(engine.LoadPlan.from_dict(run.plan), run.shards_total)[index]
    monitor = ShardMonitor(run, shard, plan)
    monitor.start()
    status, reason, error = CapacityShard.Status.DONE, "", ""
    try:
        _wait_until(run.start_at, monitor.cancel.is_set)
        skew_s = (_now() - run.start_at).total_seconds() if run.start_at else 0.0
        CapacityShard.objects.filter(pk=shard.pk).update(start_skew_s=round(max(skew_s, 0.0), 4))
        if monitor.cancel.is_set():
            reason = "cancelled"
        else:
            result = engine.run_plan(plan, progress=monitor.on_progress, cancel=monitor.cancel)
            reason = result.stopped_reason
            _store_shard_steps(run_id, index, result)
    except Exception as exc:
        log.exception("capacity shard %s/%s failed", run_id, index)
        status, reason, error = CapacityShard.Status.FAILED, "error", f"{type(exc).__name__}: {exc}"
    finally:
        monitor.stop()
    if monitor.latest is not None:
        monitor._write_progress(monitor.latest)
    _shard_done(shard.pk, status, stopped_reason=reason, error=error)
    return shard_finished(run_id)


def _shard_done(shard_id: int, status: str, *, stopped_reason: str, error: str = "") -> None:
    fields: dict[str, Any] = {"status": status, "stopped_reason": stopped_reason[:32], "error": error[:2000],
                              "finished_at": _now()}
    if status == CapacityShard.Status.DONE and stopped_reason == "completed":
        fields["percent"] = 100.0
    CapacityShard.objects.filter(pk=shard_id).update(**fields)


def _step_row(run_id: int, index: int, shard: int | None, r: engine.StepResult) -> StepResult:
    return StepResult(
        run_id=run_id, index=index, shard=shard, offered_rate=r.offered_rate, achieved_rate=r.achieved_rate,
        duration_s=r.duration_s, users=r.users, sent=r.sent, ok=r.ok, errors=dict(r.errors),
        error_count=r.error_count, pool_exhausted=r.pool_exhausted, p50_ms=r.p50_ms, p90_ms=r.p90_ms,
        p99_ms=r.p99_ms, p999_ms=r.p999_ms, max_ms=r.max_ms, histogram=r.histogram)


def _engine_step(row: StepResult) -> engine.StepResult:
    return engine.StepResult(
        offered_rate=row.offered_rate, achieved_rate=row.achieved_rate, duration_s=row.duration_s, ok=row.ok,
        errors=dict(row.errors), histogram=row.histogram, p50_ms=row.p50_ms, p90_ms=row.p90_ms,
        p99_ms=row.p99_ms, p999_ms=row.p999_ms, max_ms=row.max_ms, sent=row.sent,
        pool_exhausted=row.pool_exhausted, users=row.users)


def _store_shard_steps(run_id: int, index: int, result: engine.RunResult) -> None:
    with transaction.atomic():
        StepResult.objects.filter(run_id=run_id, shard=index).delete()
        StepResult.objects.bulk_create([_step_row(run_id, i, index, r) for i, r in enumerate(result.steps)])


# --- the last shard: merge, knee, recommendation ------------------------------------------------


def shard_finished(run_id: int) -> str:
    with transaction.atomic():
        run = CapacityRun.objects.select_for_update().select_related("test__org").get(pk=run_id)
        CapacityRun.objects.filter(pk=run_id).update(shards_done=F("shards_done") + 1)
        run.refresh_from_db(fields=["shards_done", "status"])
        if run.shards_done < run.shards_total:
            return "shard_done"
        run_finalize(run)
    return "finalized"


def run_finalize(run: CapacityRun) -> None:
    """Merge shard results per step exactly, then decide the outcome (called under the run's row lock)."""
    shards = list(CapacityShard.objects.filter(run=run))
    rows = list(StepResult.objects.filter(run=run, shard__isnull=False).order_by("index", "shard"))
    by_index: dict[int, list[StepResult]] = {}
    for row in rows:
        by_index.setdefault(row.index, []).append(row)
    merged = {i: engine.merge_step_results([_engine_step(r) for r in group]) for i, group in by_index.items()}
    StepResult.objects.filter(run=run, shard__isnull=True).delete()
    StepResult.objects.bulk_create([_step_row(run.pk, i, None, r) for i, r in sorted(merged.items())])

    reasons = {s.stopped_reason for s in shards}
    stopped = next((x for x in ("cap_exceeded", "cancelled", "error", "lost", "max_duration", "max_requests")
                    if x in reasons), "completed")
    fields: dict[str, Any] = {
        "finished_at": run.finished_at or _now(),
        "stopped_reason": run.stopped_reason or stopped,
        "sent": sum(r.sent for r in merged.values()),
        "ok": sum(r.ok for r in merged.values()),
        "errors": sum(r.error_count for r in merged.values()),
    }
    if run.status == CapacityRun.Status.RUNNING:
        broken = [s for s in shards if s.status in (CapacityShard.Status.FAILED, CapacityShard.Status.LOST)]
        if broken:
            fields.update(status=CapacityRun.Status.FAILED, error_code="shard_failed",
                          error="; ".join(f"shard {s.index}: {s.error}" for s in broken)[:2000])
        else:
            fields.update(status=CapacityRun.Status.SUCCEEDED, progress_percent=100.0,
                          current_step=max(len(merged) - 1, 0))
            fields.update(_outcome(run, [merged[i] for i in sorted(merged)], sent=fields["sent"]))
            # "Succeeded" means a knee or a clean "no knee up to N req/s": a run whose lowest step
            # already misses the SLO (every request refused, say) measured nothing and says why.
            if fields["knee_code"] in (knee.FIRST_STEP_FAILED, knee.NO_STEPS):
                fields.update(status=CapacityRun.Status.FAILED, error_code=fields["knee_code"],
                              error=fields["knee_reason"][:2000])
    CapacityRun.objects.filter(pk=run.pk).update(**fields)
    if run.test.pool_id is not None:
        overflow_release(run.test.pool_id)
    if "status" in fields:
        code, rps = fields.get("knee_code"), fields.get("knee_capacity_rps")
        # The same words as the run's page: a knee only when one was found.
        if code == knee.KNEE_FOUND and rps is not None:
            outcome = f"knee at {rps:.1f} req/s"
        elif code == knee.ALL_PASSED and rps is not None:
            outcome = f"no knee found up to {rps:.1f} req/s (every step held the SLO)"
        else:
            outcome = fields.get("knee_reason") or fields.get("error") or fields.get("stopped_reason", "")
        event_emit("capacity.run_finished", org=run.test.org, obj=run, object_repr=f"{run.test.name} #{run.pk}",
                   data={"status": fields["status"], "outcome": outcome, "knee_code": code,
                         "knee_rps": rps if code == knee.KNEE_FOUND else None, "highest_passing_rps": rps,
                         "recommended_max_rate_per_member": fields.get("recommended_max_rate_per_member"),
                         "test": run.test.name})


def _pool_counters(pool_region) -> dict[str, dict[str, int]] | None:
    """{node: {backend: requests sent to it so far}} for the pool-region's backends on every enabled node of the
    fleets serving its LB (`show stat`); None when a node cannot be read (the share is then not known)."""
    from apps.fleets import selectors as fleet_selectors
    from apps.fleets.models import Node

    lb = pool_region.pool.lb
    backends = {fleet_selectors.backend_name(pool_region.pool_id, pool_region.region.slug, proto)
                for proto in ("http", "tcp")}
    out: dict[str, dict[str, int]] = {}
    for node in Node.objects.filter(fleet__in=fleet_selectors.lb_fleets(lb), enabled=True).select_related("fleet"):
        state = fleet_selectors.read_state(fleet_selectors.node_conn(node), with_stats=True, with_disk=False)
        if not state.reachable:
            return None
        out[str(node)] = {
            row.pxname: int(row.raw.get("stot") or 0) for row in state.stats
            if row.svname == "BACKEND" and row.pxname in backends}
    return out or None  # no HAProxy node serves it (a cloud LB): nothing to count


def _served_since(start: dict[str, dict[str, int]] | None, now: dict[str, dict[str, int]] | None) -> int | None:
    if start is None or now is None or start.keys() != now.keys():
        return None
    return sum(max(0, count - start[node].get(backend, 0)) for node, totals in now.items()
               for backend, count in totals.items())


def _outcome(run: CapacityRun, steps: list[engine.StepResult], sent: int = 0) -> dict[str, Any]:
    test = run.test
    result = knee.find_knee(knee.summarize(steps), test.slo_p99_ms, test.slo_error_rate)
    out: dict[str, Any] = {"knee_capacity_rps": result.capacity_rps, "knee_step_index": result.step_index,
                           "knee_code": result.code, "knee_reason": result.reason}
    pool_region = pool_region_for(test)
    if run.for_drill:
        out["recommendation_note"] = "A failover drill's load (overflow allowed): nothing to recommend from it."
    elif test.pool_id is None:
        out["recommendation_note"] = "The test names no pool, so there is nothing to recommend for."
    elif pool_region is None:
        out["recommendation_note"] = "Name the region: the pool has several and the listener's fleet has none."
    elif result.capacity_rps is None:
        out["pool_region"] = pool_region
        out["recommendation_note"] = f"No capacity found: {result.reason}"
    else:
        healthy = healthy_member_count(pool_region)
        out.update(pool_region=pool_region, healthy_members=healthy)
        served = _served_since(run.pool_counters_start, _pool_counters(pool_region))
        share = min(1.0, served / sent) if served is not None and sent else None
        out["pool_served"] = served
        pool_rps = result.capacity_rps * (share if share is not None else 1.0)
        if healthy < 1:
            out["recommendation_note"] = "The pool has no active member in that region to share the capacity."
        elif share is not None and share < 0.05:
            out["recommendation_note"] = (
                f"The pool's {pool_region.region.slug} members served {served} of the {sent} requests the test sent "
                "(the rest went to other pools or regions): too few to say what they can take. Test the pool's "
                "own route, or hold the canary split and overflow off.")
        else:
            out["recommended_max_rate_per_member"] = knee.recommend_max_rate_per_member(
                pool_rps, healthy, test.safety_factor)
            counted = (f"{result.capacity_rps:.1f} req/s measured" if share is None or share > 0.999 else
                       f"{result.capacity_rps:.1f} req/s measured x {share:.0%} that the pool's "
                       f"{pool_region.region.slug} members served ({served} of {sent} requests; a canary split or "
                       "overflow took the rest)")
            unknown = "" if share is not None else (" (no serving node's counters were read, so all of it counts as "
                                                    "the pool's)")
            out["recommendation_note"] = (f"{counted}{unknown} / {healthy} active member(s) "
                                          f"x safety factor {test.safety_factor:g}")
    return out


# --- housekeeping ----------------------------------------------------------------------------


def reap_stale_runs() -> int:
    """Fail runs whose shards never all reported (a lost message, a worker gone for good)."""
    reaped = 0
    now = _now()
    for run in CapacityRun.objects.filter(status__in=CapacityRun.ACTIVE):
        if run.start_at is None:
            overdue = run.created_at + timedelta(seconds=PENDING_GRACE_S) < now
        else:
            max_s = float((run.plan or {}).get("max_duration_s", 0.0))
            overdue = run.start_at + timedelta(seconds=max_s + STALE_GRACE_S) < now
        if overdue and _fail_run(run.pk, "run_stale",
                                 "The run's shards did not all report in time; a worker was lost."):
            reaped += 1
    return reaped
