"""Knee detection on plain numbers: no database, no network."""

from __future__ import annotations

import pytest

from apps.capacity.knee import (
    ALL_PASSED,
    FIRST_STEP_FAILED,
    KNEE_FOUND,
    NO_STEPS,
    StepSummary,
    find_knee,
    recommend_max_rate_per_member,
    summarize,
)

SLO_P99_MS = 100.0
SLO_ERROR_RATE = 0.01


def step(
    offered: float, p99_ms: float = 20.0, error_rate: float = 0.0, achieved: float | None = None
) -> StepSummary:
    return StepSummary(offered, offered if achieved is None else achieved, p99_ms, error_rate)


def knee(steps: list[StepSummary]):
    return find_knee(steps, SLO_P99_MS, SLO_ERROR_RATE)


def test_capacity_is_the_last_step_before_latency_breaks_the_slo():
    result = knee([step(100), step(200), step(300, p99_ms=80), step(400, p99_ms=450), step(500, p99_ms=900)])
    assert result.capacity_rps == 300
    assert result.step_index == 2
    assert result.code == KNEE_FOUND
    assert "400 req/s" in result.reason and "p99 450 ms > 100 ms" in result.reason


def test_an_error_rate_over_the_slo_fails_a_step_even_when_fast():
    result = knee([step(100), step(200, p99_ms=5, error_rate=0.02)])
    assert result.capacity_rps == 100
    assert "error rate 2.00% > 1.00%" in result.reason


def test_a_step_the_target_could_not_keep_up_with_does_not_count():
    # Fast and error-free, but only 180 of 200 req/s served (90% < 95%): the target is saturated.
    result = knee([step(100), step(200, achieved=180)])
    assert result.capacity_rps == 100
    assert "achieved 180.0 req/s < 95% of offered 200.0 req/s" in result.reason


def test_achieved_at_95_percent_still_counts():
    result = knee([step(100), step(200, achieved=190)])
    assert result.capacity_rps == 190
    assert result.code == ALL_PASSED


def test_capacity_reports_the_measured_rate_not_the_planned_one():
    result = knee([step(100, achieved=98.5), step(200, p99_ms=500)])
    assert result.capacity_rps == 98.5


def test_a_pass_after_a_failure_does_not_raise_capacity():
    # 300 fails, then 400 passes (say, a cache warmed up): capacity stays at 200.
    result = knee([step(100), step(200), step(300, p99_ms=250), step(400, p99_ms=30)])
    assert result.capacity_rps == 200
    assert result.step_index == 1


def test_steps_are_judged_from_the_lowest_rate_whatever_the_order_given():
    steps = [step(300, p99_ms=250), step(100), step(200)]
    result = knee(steps)
    assert result.capacity_rps == 200
    assert result.step_index == 2  # index into the list as given


def test_no_capacity_when_the_lowest_step_already_fails():
    result = knee([step(50, p99_ms=150), step(100)])
    assert result.capacity_rps is None
    assert result.step_index is None
    assert result.code == FIRST_STEP_FAILED
    assert "lowest step (50 req/s)" in result.reason


def test_every_step_passing_gives_a_lower_bound_and_says_so():
    result = knee([step(100), step(200)])
    assert result.capacity_rps == 200
    assert result.code == ALL_PASSED
    assert "at least 200.0 req/s" in result.reason


def test_steps_without_load_are_ignored():
    assert knee([]).code == NO_STEPS
    assert knee([step(0)]).code == NO_STEPS
    result = knee([step(0, p99_ms=999), step(100)])
    assert result.capacity_rps == 100
    assert result.step_index == 1


def test_slo_values_are_validated():
    with pytest.raises(ValueError):
        find_knee([step(1)], 0, 0.01)
    with pytest.raises(ValueError):
        find_knee([step(1)], 100, 1.5)


def test_summarize_reads_engine_step_results():
    class Result:
        offered_rate = 100.0
        achieved_rate = 99.0
        p99_ms = 12.5
        error_rate = 0.002

    assert summarize([Result()]) == [StepSummary(100.0, 99.0, 12.5, 0.002)]


@pytest.mark.parametrize(
    ("capacity", "members", "factor", "expected"),
    [
        (1000.0, 4, 0.8, 200.0),
        (1000.0, 3, 0.8, 266.6),  # 266.66.. rounded down, never up
        (450.0, 1, 1.0, 450.0),
        (99.0, 2, 0.5, 24.7),
        (0.0, 5, 0.8, 0.0),
    ],
)
def test_recommended_rate_per_member_divides_capacity_with_headroom(capacity, members, factor, expected):
    assert recommend_max_rate_per_member(capacity, members, factor) == expected


def test_recommendation_uses_a_default_safety_factor_of_80_percent():
    assert recommend_max_rate_per_member(500.0, 2) == 200.0


@pytest.mark.parametrize(
    ("capacity", "members", "factor"), [(-1.0, 1, 0.8), (100.0, 0, 0.8), (100.0, 1, 0.0)]
)
def test_recommendation_rejects_nonsense(capacity, members, factor):
    with pytest.raises(ValueError):
        recommend_max_rate_per_member(capacity, members, factor)
