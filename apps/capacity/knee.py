"""Knee detection: the highest load a target served within its SLO, and what to configure from it.

Pure functions of plain numbers (no Django, no I/O).

Rule: walk the steps from the lowest offered rate up; a step *passes* when its p99 and error rate
are within the SLO and the target kept up (achieved >= 95% of offered). Capacity is the last step
of the unbroken run of passing steps that starts at the lowest step. A step that passes *after* a
failing one does not raise capacity: once a target has fallen over, a lucky later step (a cache
warmed up, a queue drained between steps, an autoscaler that kicked in) is not capacity one can
plan on, and trusting it would turn a single noisy pass into an overload in production.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

MIN_ACHIEVED_FRACTION = 0.95

NO_STEPS = "no_steps"
FIRST_STEP_FAILED = "first_step_failed"
KNEE_FOUND = "knee_found"
ALL_PASSED = "all_passed"


@dataclass(frozen=True)
class StepSummary:
    offered_rate: float
    achieved_rate: float
    p99_ms: float
    error_rate: float


class _StepLike(Protocol):
    offered_rate: float
    achieved_rate: float
    p99_ms: float

    @property
    def error_rate(self) -> float: ...


@dataclass(frozen=True)
class KneeResult:
    """`capacity_rps` is the achieved rate of the capacity step (measured, not planned), or None
    when even the lowest step missed the SLO. `step_index` indexes the list given to `find_knee`.
    `code` is stable for machines; `reason` is the sentence for people."""

    capacity_rps: float | None
    step_index: int | None
    reason: str
    code: str


def summarize(results: Iterable[_StepLike]) -> list[StepSummary]:
    """StepSummary from anything shaped like the engine's StepResult."""
    return [StepSummary(r.offered_rate, r.achieved_rate, r.p99_ms, r.error_rate) for r in results]


def step_failure(
    step: StepSummary,
    slo_p99_ms: float,
    slo_error_rate: float,
    min_achieved_fraction: float = MIN_ACHIEVED_FRACTION,
) -> str | None:
    """Why the step misses the SLO, or None if it meets it."""
    if step.error_rate > slo_error_rate:
        return f"error rate {step.error_rate:.2%} > {slo_error_rate:.2%}"
    if step.p99_ms > slo_p99_ms:
        return f"p99 {step.p99_ms:g} ms > {slo_p99_ms:g} ms"
    if step.achieved_rate < min_achieved_fraction * step.offered_rate:
        return (
            f"achieved {step.achieved_rate:.1f} req/s < {min_achieved_fraction:.0%} "
            f"of offered {step.offered_rate:.1f} req/s"
        )
    return None


def find_knee(
    steps: list[StepSummary],
    slo_p99_ms: float,
    slo_error_rate: float,
    *,
    min_achieved_fraction: float = MIN_ACHIEVED_FRACTION,
) -> KneeResult:
    if slo_p99_ms <= 0 or not 0 <= slo_error_rate <= 1:
        raise ValueError("slo_p99_ms must be > 0 and slo_error_rate in [0, 1]")
    # Steps with no offered load carry no evidence either way (pauses between stages).
    ordered = sorted(
        (i for i, s in enumerate(steps) if s.offered_rate > 0), key=lambda i: steps[i].offered_rate
    )
    if not ordered:
        return KneeResult(None, None, "no steps with load to judge", NO_STEPS)
    best: int | None = None
    for i in ordered:
        step = steps[i]
        why = step_failure(step, slo_p99_ms, slo_error_rate, min_achieved_fraction)
        if why is None:
            best = i
            continue
        if best is None:
            return KneeResult(
                None,
                None,
                f"the lowest step ({step.offered_rate:g} req/s) already misses the SLO: {why}",
                FIRST_STEP_FAILED,
            )
        capacity = steps[best].achieved_rate
        return KneeResult(
            capacity,
            best,
            f"capacity {capacity:.1f} req/s (step {best}); the next step ({step.offered_rate:g} req/s) "
            f"misses the SLO: {why}",
            KNEE_FOUND,
        )
    assert best is not None
    capacity = steps[best].achieved_rate
    return KneeResult(
        capacity,
        best,
        f"every step met the SLO; capacity is at least {capacity:.1f} req/s "
        "(run higher rates to find the knee)",
        ALL_PASSED,
    )


def recommend_max_rate_per_member(
    capacity_rps: float, healthy_members: int, safety_factor: float = 0.8
) -> float:
    """Per-member rate to configure so the pool runs below its knee.

    Capacity measured through the load balancer is shared by the healthy members that served it;
    the safety factor keeps headroom for uneven balancing and noise. Rounded *down* to 0.1 req/s:
    a recommendation must never exceed what was measured.
    """
    if capacity_rps < 0:
        raise ValueError("capacity_rps must not be negative")
    if healthy_members < 1:
        raise ValueError("need at least one healthy member to divide capacity between")
    if not 0 < safety_factor <= 1:
        raise ValueError("safety_factor must be in (0, 1]")
    return math.floor(capacity_rps * safety_factor / healthy_members * 10 + 1e-9) / 10
