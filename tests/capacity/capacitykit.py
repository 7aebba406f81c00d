"""Waiting for a capacity run, telling a stall of this shared machine from a queue, and finished runs built without
sending load (the capacity API's and pages' tests)."""

from __future__ import annotations

from apps.capacity import engine, execution
from apps.capacity.engine.results import new_histogram
from apps.capacity.models import CapacityRun, CapacityShard, CapacityTest, StepResult
from tests.waiting import wait_until

TESTS = "/api/v1/capacity-tests/"
RUNS = "/api/v1/capacity-runs/"


def wait_for_run(run_id: int, timeout_s: float = 30.0) -> CapacityRun:
    def finished() -> CapacityRun | None:
        run = CapacityRun.objects.get(pk=run_id)
        done = not run.is_active and run.finished_at is not None and run.shards_done >= run.shards_total
        never_started = not run.is_active and run.plan is None
        return run if done or never_started else None

    return wait_until(finished, timeout_s, 0.1, what=f"capacity run {run_id} finished")


def served_in_full(step) -> bool:
    """A step (the engine's or a stored one) that served what it was sent, without errors: a target past its
    capacity serves less."""
    return step.achieved_rate >= 0.95 * step.offered_rate and step.error_count == 0


def answered_all(step) -> bool:
    """A step (the engine's or a stored one) whose every request sent got a 2xx, some perhaps past its window: a
    stall of this shared machine makes answers late, it loses none."""
    return step.sent > 0 and step.ok == step.sent and step.error_count == 0


def stalled_not_queued(step, median_below_ms: float) -> bool:
    """A step (the engine's or a stored one) that missed its p99 to a stall of this shared machine, not to a queue:
    served in full, without errors, its median within twice `median_below_ms` (the steps below it, or the server's
    service time). A target past its capacity moves the median too: requests queue."""
    return served_in_full(step) and step.p50_ms <= 2 * median_below_ms


def step_result(offered: float, achieved: float, latency_ms: float, ok: int, errors: int = 0) -> engine.StepResult:
    hist = new_histogram()
    hist.record_value(int(latency_ms * 1000), ok)
    return engine.StepResult.build(offered_rate=offered, achieved_rate=achieved, duration_s=2.0, ok=ok,
                                   errors={"timeout": errors}, hist=hist, sent=ok + errors)


def finished_run(test: CapacityTest, shards: list[list[engine.StepResult]]) -> CapacityRun:
    """A run as its shards would leave it, finalized by the same code the last shard runs."""
    run = CapacityRun.objects.create(test=test, status=CapacityRun.Status.RUNNING, shards_total=len(shards),
                                     step_count=len(shards[0]), plan={"max_duration_s": 10.0})
    for index, steps in enumerate(shards):
        CapacityShard.objects.create(run=run, index=index, status=CapacityShard.Status.DONE,
                                     stopped_reason="completed")
        StepResult.objects.bulk_create([execution._step_row(run.pk, i, index, s) for i, s in enumerate(steps)])
    for _ in shards:
        execution.shard_finished(run.pk)
    run.refresh_from_db()
    return run


def knee_run(capacity_test_pk: int) -> CapacityRun:
    """Two shards: fine at 50 and 100 req/s in total, falling over at 200 (p99 400 ms)."""
    test = CapacityTest.objects.get(pk=capacity_test_pk)
    half = [step_result(25, 25, 5, 50), step_result(50, 49.6, 8, 100), step_result(100, 60, 400, 120, errors=10)]
    return finished_run(test, [half, half])
