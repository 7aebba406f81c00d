"""Results of a load run: per-step counts and an exact latency histogram, and how shards merge.

Latency is kept as an encoded HdrHistogram (microseconds, 1 us .. 60 s, 3 significant digits), so
results from shards run on different workers merge exactly: decode, add, re-read the percentiles.
Averaging percentiles would be wrong; adding histograms is not.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from hdrh.histogram import HdrHistogram

REFUSED = "refused"
RESET = "reset"
TIMEOUT = "timeout"
NON_2XX = "non_2xx"
BAD_RESPONSE = "bad_response"
OTHER = "other"
ERROR_KINDS: tuple[str, ...] = (REFUSED, RESET, TIMEOUT, NON_2XX, BAD_RESPONSE, OTHER)

HIST_LOWEST_US = 1
HIST_HIGHEST_US = 60_000_000
HIST_SIGNIFICANT_DIGITS = 3


def new_histogram() -> HdrHistogram:
    return HdrHistogram(HIST_LOWEST_US, HIST_HIGHEST_US, HIST_SIGNIFICANT_DIGITS)


def encode_histogram(hist: HdrHistogram) -> str:
    return hist.encode().decode("ascii")


def decode_histogram(encoded: str) -> HdrHistogram:
    if not encoded:
        return new_histogram()
    return HdrHistogram.decode(encoded)


def record_latencies_us(hist: HdrHistogram, latencies_us: list[int]) -> None:
    """Record a batch of latencies.

    The hot path only appends ints to a list (~50 ns); recording each one into the pure-Python
    histogram costs ~0.8 us, so batches are counted first and recorded once per distinct value.
    Out-of-range values are clamped, never dropped: a 90 s response must still count as slow.
    """
    for value, count in Counter(latencies_us).items():
        hist.record_value(min(max(value, HIST_LOWEST_US), HIST_HIGHEST_US), count)


def empty_errors() -> dict[str, int]:
    return dict.fromkeys(ERROR_KINDS, 0)


@dataclass(frozen=True)
class StepResult:
    """What one step (or the merge of several shards' same step) measured.

    `ok` counts 2xx responses, whose latencies alone are in `histogram` (so a fast 503 cannot make a
    target look quick); every other outcome is in `errors` by kind. Requests are attributed to the
    step of their intended send time. `achieved_rate` is 2xx responses completed inside the step's
    time window per second, so a target that falls behind shows achieved < offered.
    `pool_exhausted`: requests that found max_connections busy and queued (timed from their
    intended send). `late_sends`: requests the engine itself sent late (it fell behind).
    """

    offered_rate: float
    achieved_rate: float
    duration_s: float
    ok: int
    errors: dict[str, int]
    histogram: str
    p50_ms: float
    p90_ms: float
    p99_ms: float
    p999_ms: float
    max_ms: float
    sent: int = 0
    pool_exhausted: int = 0
    late_sends: int = 0
    users: int = 0

    @property
    def error_count(self) -> int:
        return sum(self.errors.values())

    @property
    def requests(self) -> int:
        return self.ok + self.error_count

    @property
    def error_rate(self) -> float:
        total = self.requests
        return self.error_count / total if total else 0.0

    @classmethod
    def build(
        cls,
        *,
        offered_rate: float,
        achieved_rate: float,
        duration_s: float,
        ok: int,
        errors: dict[str, int],
        hist: HdrHistogram,
        sent: int = 0,
        pool_exhausted: int = 0,
        late_sends: int = 0,
        users: int = 0,
    ) -> StepResult:
        """Build a result whose percentiles are read from `hist`, the one source of truth."""

        def ms(us: float) -> float:
            return round(us / 1000.0, 3)

        empty = hist.get_total_count() == 0
        return cls(
            offered_rate=offered_rate,
            achieved_rate=achieved_rate,
            duration_s=duration_s,
            ok=ok,
            errors={kind: int(errors.get(kind, 0)) for kind in ERROR_KINDS},
            histogram=encode_histogram(hist),
            p50_ms=0.0 if empty else ms(hist.get_value_at_percentile(50.0)),
            p90_ms=0.0 if empty else ms(hist.get_value_at_percentile(90.0)),
            p99_ms=0.0 if empty else ms(hist.get_value_at_percentile(99.0)),
            p999_ms=0.0 if empty else ms(hist.get_value_at_percentile(99.9)),
            max_ms=0.0 if empty else ms(hist.get_max_value()),
            sent=sent,
            pool_exhausted=pool_exhausted,
            late_sends=late_sends,
            users=users,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StepResult:
        return cls(**data)


def merge_step_results(results: list[StepResult]) -> StepResult:
    """Merge the same step as measured by concurrent shards.

    Counts and rates add (the shards offered load side by side), histograms add exactly, and the
    percentiles are re-read from the merged histogram. Duration is the longest shard's.
    """
    if not results:
        raise ValueError("nothing to merge")
    hist = new_histogram()
    errors = empty_errors()
    for r in results:
        hist.add(decode_histogram(r.histogram))
        for kind, n in r.errors.items():
            errors[kind] = errors.get(kind, 0) + n
    return StepResult.build(
        offered_rate=sum(r.offered_rate for r in results),
        achieved_rate=sum(r.achieved_rate for r in results),
        duration_s=max(r.duration_s for r in results),
        ok=sum(r.ok for r in results),
        errors=errors,
        hist=hist,
        sent=sum(r.sent for r in results),
        pool_exhausted=sum(r.pool_exhausted for r in results),
        late_sends=sum(r.late_sends for r in results),
        users=sum(r.users for r in results),
    )


def combine_sequential(results: list[StepResult]) -> StepResult:
    """One summary for steps that ran one after another (rates are time-weighted, not added)."""
    if not results:
        raise ValueError("nothing to combine")
    hist = new_histogram()
    errors = empty_errors()
    for r in results:
        hist.add(decode_histogram(r.histogram))
        for kind, n in r.errors.items():
            errors[kind] = errors.get(kind, 0) + n
    duration_s = sum(r.duration_s for r in results)

    def weighted(values: list[float]) -> float:
        if not duration_s:
            return 0.0
        return sum(v * r.duration_s for v, r in zip(values, results, strict=True)) / duration_s

    return StepResult.build(
        offered_rate=weighted([r.offered_rate for r in results]),
        achieved_rate=weighted([r.achieved_rate for r in results]),
        duration_s=duration_s,
        ok=sum(r.ok for r in results),
        errors=errors,
        hist=hist,
        sent=sum(r.sent for r in results),
        pool_exhausted=sum(r.pool_exhausted for r in results),
        late_sends=sum(r.late_sends for r in results),
        users=max(r.users for r in results),
    )


@dataclass(frozen=True)
class Progress:
    """Live state handed to the progress callback about every 0.5 s."""

    percent: float
    step_index: int
    step_count: int
    elapsed_s: float
    achieved_rate: float
    sent: int
    ok: int
    errors: int


@dataclass(frozen=True)
class RunResult:
    """A whole run. `stopped_reason` is completed | max_requests | max_duration | cancelled.

    `abandoned` counts requests still outstanding when a cancel stopped the run; they are in no
    step's counts. Requests cut off by max_duration count as timeouts instead.
    """

    mode: str
    steps: list[StepResult]
    stopped_reason: str
    elapsed_s: float
    connections_opened: int
    abandoned: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def total(self) -> StepResult:
        return combine_sequential(self.steps)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunResult:
        fields = dict(data)
        fields["steps"] = [StepResult.from_dict(s) for s in fields["steps"]]
        return cls(**fields)


def merge_run_results(results: list[RunResult]) -> RunResult:
    """Merge shards of one split plan step by step (shards that stopped early have fewer steps)."""
    if not results:
        raise ValueError("nothing to merge")
    step_count = max(len(r.steps) for r in results)
    steps = [
        merge_step_results([r.steps[i] for r in results if i < len(r.steps)]) for i in range(step_count)
    ]
    reasons = {r.stopped_reason for r in results}
    reason = next(
        (x for x in ("cancelled", "max_duration", "max_requests") if x in reasons), "completed"
    )
    return RunResult(
        mode=results[0].mode,
        steps=steps,
        stopped_reason=reason,
        elapsed_s=max(r.elapsed_s for r in results),
        connections_opened=sum(r.connections_opened for r in results),
        abandoned=sum(r.abandoned for r in results),
    )
