"""Spillway's load engine: open- and closed-loop HTTP/1.1 load with exact, mergeable latency.

No Django here: a Celery task builds a `LoadPlan`, calls `run_plan`, and stores the `RunResult`.
"""

from .plan import HARD_MAX_CONNECTIONS, HARD_MAX_DURATION_S, HARD_MAX_RATE, LoadPlan, Step, Target, split_plan
from .results import (
    ERROR_KINDS,
    Progress,
    RunResult,
    StepResult,
    decode_histogram,
    merge_run_results,
    merge_step_results,
)
from .runner import run_plan, run_plan_async

__all__ = [
    "ERROR_KINDS",
    "HARD_MAX_CONNECTIONS",
    "HARD_MAX_DURATION_S",
    "HARD_MAX_RATE",
    "LoadPlan",
    "Progress",
    "RunResult",
    "Step",
    "StepResult",
    "Target",
    "decode_histogram",
    "merge_run_results",
    "merge_step_results",
    "run_plan",
    "run_plan_async",
    "split_plan",
]
