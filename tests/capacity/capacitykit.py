"""Waiting for a capacity run, and telling a stall of this shared machine from a queue."""

from __future__ import annotations

from apps.capacity.models import CapacityRun
from tests.waiting import wait_until


def wait_for_run(run_id: int, timeout_s: float = 30.0) -> CapacityRun:
    def finished() -> CapacityRun | None:
        run = CapacityRun.objects.get(pk=run_id)
        done = not run.is_active and run.finished_at is not None and run.shards_done >= run.shards_total
        never_started = not run.is_active and run.plan is None
        return run if done or never_started else None

    return wait_until(finished, timeout_s, 0.1, what=f"capacity run {run_id} finished")


def stalled_not_queued(step, median_below_ms: float) -> bool:
    """A step (the engine's or a stored one) that missed its p99 to a stall of this shared machine, not to a queue:
    served in full, without errors, its median within twice `median_below_ms` (the steps below it, or the server's
    service time). A target past its capacity moves the median too: requests queue."""
    return (step.achieved_rate >= 0.95 * step.offered_rate and step.error_count == 0
            and step.p50_ms <= 2 * median_below_ms)
