"""DemandMeter (apps.fleets.enforcement): demand from the enforcer's readings of cumulative counts. Pure."""

from __future__ import annotations

import math
import random

import pytest

from apps.fleets.enforcement import DemandMeter, NodeReading


def _feed(meter: DemandMeter, rates: list[float], period_s: float = 0.25, jitter_s: float = 0.03,
          seed: int = 1) -> list[float]:
    """Readings about every `period_s` (the loop's runs jitter) of a counter of requests arriving at
    rates[i], evenly spaced (the open-loop load of the benchmarks); the demand the meter reports."""
    rnd = random.Random(seed)
    arrived, t, seen = 0.0, 100.0, []
    for rate in rates:
        step = period_s + rnd.uniform(-jitter_s, jitter_s)
        t += step
        arrived += rate * step
        reading = NodeReading(1, "a", True, demand={7: -1.0}, counts={7: math.floor(arrived)}, at=t)
        meter.observe(reading)
        seen.append(reading.demand[7])
    return seen


def test_a_step_of_demand_is_seen_within_one_reading_after_the_shortest_span() -> None:
    seen = _feed(DemandMeter(), [0.0] * 8 + [40.0] * 8)
    assert seen[0] == -1.0  # one reading: nothing to difference, HAProxy's sliding rate stands
    assert all(v == pytest.approx(40.0, rel=0.2) for v in seen[8:]), seen  # from 0.25 s after the step


def test_a_fall_of_demand_is_seen_at_once_too() -> None:
    seen = _feed(DemandMeter(), [60.0] * 8 + [15.0] * 8)
    assert all(v == pytest.approx(15.0, rel=0.25) for v in seen[8:]), seen


def test_a_steady_demand_is_counted_over_the_whole_window_not_the_noisy_last_reading() -> None:
    steady = _feed(DemandMeter(), [13.0] * 80, seed=3)[8:]
    assert all(v == pytest.approx(13.0, rel=0.1) for v in steady), steady
    short = _feed(DemandMeter(window_s=0.25), [13.0] * 80, seed=3)[8:]
    assert max(short) - min(short) > 2 * (max(steady) - min(steady)), (steady, short)


def test_a_counter_that_starts_again_is_not_a_negative_demand() -> None:
    meter = DemandMeter()
    for at, count in ((1.0, 100), (1.25, 110), (1.5, 3)):
        reading = NodeReading(1, "a", True, demand={7: 5.0}, counts={7: count}, at=at)
        meter.observe(reading)
    assert reading.demand[7] == 5.0  # after the reset: one reading only, the sliding rate stands
