"""Latency histograms with fixed log-spaced buckets: summed across series and time by adding counts. Pure.

Fixed buckets (not HDR histograms per series) because a chart sums hundreds of series-buckets per point:
adding two lists of ~60 counts is cheap, and the storage is a sparse {index: count} per row. Each bucket
is 25% wider than the one below it, so a percentile read by interpolating inside its bucket is within
about 12% of the true value (tests/signals/test_hist.py measures it).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Mapping

# Upper bounds (ms) of the buckets: 0, then 1 ms growing by 25% to a minute; the last bucket is open.
RATIO = 1.25
BOUNDS: tuple[float, ...] = (0.0, *(round(RATIO ** i, 3) for i in range(50)))
SIZE = len(BOUNDS) + 1


def index(ms: int) -> int:
    """The bucket of a time in ms (0 ms is its own bucket)."""
    return bisect_right(BOUNDS, ms - 1e-9) if ms > 0 else 0


def new() -> list[int]:
    return [0] * SIZE


def sparse(counts: list[int]) -> dict[str, int]:
    """For storage (JSON keys are strings)."""
    return {str(i): n for i, n in enumerate(counts) if n}


def add_sparse(into: list[int], stored: Mapping[str, int]) -> None:
    for key, n in stored.items():
        into[int(key)] += n


def merged(rows: Iterable[Mapping[str, int]]) -> list[int]:
    counts = new()
    for row in rows:
        add_sparse(counts, row)
    return counts


def percentile(counts: list[int], q: float) -> float | None:
    """The q-quantile (0..1) in ms, interpolated inside its bucket; None without samples."""
    total = sum(counts)
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            low = BOUNDS[i - 1] if 0 < i <= len(BOUNDS) else (BOUNDS[-1] if i else 0.0)
            high = BOUNDS[i] if i < len(BOUNDS) else BOUNDS[-1] * RATIO
            return low + (high - low) * max(0.0, min(1.0, (rank - seen) / n))
        seen += n
    return BOUNDS[-1]
