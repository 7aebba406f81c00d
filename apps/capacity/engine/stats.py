"""Mutable per-step accumulator used on the hot path, turned into a StepResult at the end."""

from __future__ import annotations

from .plan import Step
from .results import StepResult, empty_errors, new_histogram, record_latencies_us


class StepStats:
    __slots__ = ("duration_s", "end_t", "errors", "hist", "index", "late_sends", "latencies_us", "offered_rate",
                 "ok", "pool_exhausted", "sent", "start_t", "step", "users", "window_ok")

    def __init__(self, index: int, step: Step, start_t: float) -> None:
        self.index = index
        self.step = step
        self.offered_rate = step.mean_rate
        self.duration_s = step.duration_s
        self.start_t = start_t
        self.end_t = start_t + step.duration_s
        self.ok = 0
        self.errors = empty_errors()
        self.latencies_us: list[int] = []
        self.hist = new_histogram()
        self.sent = 0
        self.pool_exhausted = 0
        self.late_sends = 0
        self.users = step.users
        # 2xx responses that completed inside [start_t, end_t), whatever step they were sent in.
        self.window_ok = 0

    def flush(self) -> None:
        if self.latencies_us:
            record_latencies_us(self.hist, self.latencies_us)
            self.latencies_us.clear()

    def result(self, stopped_t: float, closed_loop: bool) -> StepResult:
        self.flush()
        duration_s = max(min(self.end_t, stopped_t) - self.start_t, 0.0)
        achieved = self.window_ok / duration_s if duration_s > 0 else 0.0
        return StepResult.build(
            # A closed loop offers exactly what the target accepts, so its offered rate is its
            # achieved rate; the knee check then judges it on latency and errors alone.
            offered_rate=achieved if closed_loop else self.offered_rate,
            achieved_rate=achieved,
            duration_s=duration_s,
            ok=self.ok,
            errors=self.errors,
            hist=self.hist,
            sent=self.sent,
            pool_exhausted=self.pool_exhausted,
            late_sends=self.late_sends,
            users=self.users,
        )
