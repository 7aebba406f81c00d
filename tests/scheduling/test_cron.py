"""Schedule evaluation: DST behaviour a user would notice, validation errors, and an oracle check.

Berlin 2026: clocks go 02:00 -> 03:00 on 2026-03-29 (01:00 UTC) and 03:00 -> 02:00 on
2026-10-25 (01:00 UTC). CET is UTC+1, CEST is UTC+2.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import given, settings
from hypothesis import strategies as st

from apps.scheduling.cron import (
    CronSchedule,
    IntervalSchedule,
    OneOffSchedule,
    ScheduleError,
    describe,
    latest_slot,
    next_fire_times,
    slots_between,
    validate_schedule,
)

BERLIN = "Europe/Berlin"


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)  # type: ignore[misc]


def on_local_date(schedule: CronSchedule, day: str) -> list[datetime]:
    """Slots whose wall-clock date in the schedule's zone is `day` (YYYY-MM-DD)."""
    zone = ZoneInfo(schedule.tz)
    start = datetime.fromisoformat(day).replace(tzinfo=zone)
    end = start + timedelta(days=2)
    slots = slots_between(schedule, start - timedelta(days=1), end)
    return [slot for slot in slots if slot.astimezone(zone).date().isoformat() == day]


# --- DST: daily fixed-time job ----------------------------------------------------------


def test_daily_0230_berlin_fires_at_0230_local_on_ordinary_days() -> None:
    daily = CronSchedule("30 2 * * *", BERLIN)
    assert on_local_date(daily, "2026-03-27") == [utc(2026, 3, 27, 1, 30)]  # CET
    assert on_local_date(daily, "2026-04-01") == [utc(2026, 4, 1, 0, 30)]  # CEST
    assert on_local_date(daily, "2026-10-26") == [utc(2026, 10, 26, 1, 30)]  # CET again


def test_daily_0230_berlin_fires_once_at_0300_on_spring_forward_day() -> None:
    """02:30 does not exist on 2026-03-29; the job runs once, at 03:00 CEST, never zero times."""
    daily = CronSchedule("30 2 * * *", BERLIN)
    assert on_local_date(daily, "2026-03-29") == [utc(2026, 3, 29, 1, 0)]


def test_daily_0230_berlin_fires_once_at_the_first_0230_on_fall_back_day() -> None:
    """02:30 happens twice on 2026-10-25 (CEST, then CET); the job runs at the first only."""
    daily = CronSchedule("30 2 * * *", BERLIN)
    assert on_local_date(daily, "2026-10-25") == [utc(2026, 10, 25, 0, 30)]


def test_next_fire_times_walk_through_both_transitions() -> None:
    daily = CronSchedule("30 2 * * *", BERLIN)
    assert next_fire_times(daily, utc(2026, 3, 28, 12, 0), count=3) == [
        utc(2026, 3, 29, 1, 0),
        utc(2026, 3, 30, 0, 30),
        utc(2026, 3, 31, 0, 30),
    ]
    assert next_fire_times(daily, utc(2026, 10, 24, 12, 0), count=2) == [
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]


def test_several_fixed_times_inside_the_gap_run_once_after_it() -> None:
    assert on_local_date(CronSchedule("0,30 2 * * *", BERLIN), "2026-03-29") == [utc(2026, 3, 29, 1, 0)]
    # The 02:00 catch-up and the 03:00 run land on the same instant: one slot, not two.
    assert on_local_date(CronSchedule("0 2,3 * * *", BERLIN), "2026-03-29") == [utc(2026, 3, 29, 1, 0)]


def test_new_york_fixed_times_fire_once_on_both_transition_days() -> None:
    """New York: 02:00 -> 03:00 on 2026-03-08; 02:00 EDT -> 01:00 EST on 2026-11-01."""
    daily = CronSchedule("30 2 * * *", "America/New_York")
    assert on_local_date(daily, "2026-03-08") == [utc(2026, 3, 8, 7, 0)]  # 03:00 EDT
    assert on_local_date(daily, "2026-11-01") == [utc(2026, 11, 1, 7, 30)]  # 02:30 EST, only once
    repeated = CronSchedule("30 1 * * *", "America/New_York")
    assert on_local_date(repeated, "2026-11-01") == [utc(2026, 11, 1, 5, 30)]  # first 01:30, EDT


def test_half_hour_dst_of_lord_howe_island() -> None:
    """Lord Howe moves 30 minutes: 02:00 -> 02:30 on 2026-10-04, 02:00 -> 01:30 on 2026-04-05."""
    assert on_local_date(CronSchedule("15 2 * * *", "Australia/Lord_Howe"), "2026-10-04") == [
        utc(2026, 10, 3, 15, 30)  # 02:30 at UTC+11
    ]
    assert on_local_date(CronSchedule("45 1 * * *", "Australia/Lord_Howe"), "2026-04-05") == [
        utc(2026, 4, 4, 14, 45)  # first 01:45, still at UTC+11
    ]


# --- DST: wildcard jobs -----------------------------------------------------------------


def _gaps(slots: list[datetime]) -> set[timedelta]:
    return {later - earlier for earlier, later in itertools.pairwise(slots)}


def test_hourly_job_fires_once_every_real_hour_across_both_transitions() -> None:
    hourly = CronSchedule("0 * * * *", BERLIN)
    spring = slots_between(hourly, utc(2026, 3, 28, 20, 30), utc(2026, 3, 29, 6, 0))
    assert spring == [utc(2026, 3, 28, 21) + timedelta(hours=n) for n in range(10)]
    fall = slots_between(hourly, utc(2026, 10, 24, 20, 30), utc(2026, 10, 25, 6, 0))
    assert fall == [utc(2026, 10, 24, 21) + timedelta(hours=n) for n in range(10)]
    # Wall clock of the fall-back night: 02:00 shows up twice, as it does on the wall.
    zone = ZoneInfo(BERLIN)
    assert [slot.astimezone(zone).hour for slot in fall] == [23, 0, 1, 2, 2, 3, 4, 5, 6, 7]


def test_every_15_minutes_keeps_a_15_minute_beat_through_dst() -> None:
    quarter = CronSchedule("*/15 * * * *", BERLIN)
    spring_day = on_local_date(quarter, "2026-03-29")
    fall_day = on_local_date(quarter, "2026-10-25")
    assert _gaps(spring_day) == {timedelta(minutes=15)}
    assert _gaps(fall_day) == {timedelta(minutes=15)}
    assert len(spring_day) == 23 * 4  # a 23-hour day
    assert len(fall_day) == 25 * 4  # a 25-hour day
    assert len(on_local_date(quarter, "2026-06-01")) == 24 * 4


def test_wildcard_job_in_the_gap_is_skipped_like_vixie_cron() -> None:
    """ISC cron runs wildcard jobs by the new clock: minutes that never show are not run."""
    in_gap = CronSchedule("*/30 2 * * *", BERLIN)
    assert on_local_date(in_gap, "2026-03-29") == []
    assert len(on_local_date(in_gap, "2026-10-25")) == 4  # 02:00, 02:30 twice each


def test_hourly_macro_is_a_wildcard_job_and_daily_macro_a_fixed_one() -> None:
    assert len(on_local_date(CronSchedule("@hourly", BERLIN), "2026-10-25")) == 25
    assert on_local_date(CronSchedule("@daily", BERLIN), "2026-10-25") == [utc(2026, 10, 24, 22, 0)]


# --- ordinary cron semantics ------------------------------------------------------------


def test_every_15_minutes_in_utc() -> None:
    quarter = CronSchedule("*/15 * * * *")
    assert next_fire_times(quarter, utc(2026, 5, 1, 10, 7), count=4) == [
        utc(2026, 5, 1, 10, 15),
        utc(2026, 5, 1, 10, 30),
        utc(2026, 5, 1, 10, 45),
        utc(2026, 5, 1, 11, 0),
    ]


def test_next_fire_times_are_strictly_after_and_truncated_to_seconds() -> None:
    quarter = CronSchedule("*/15 * * * *")
    slots = next_fire_times(quarter, datetime(2026, 5, 1, 12, 15, 0, 999, tzinfo=UTC), count=1)
    assert slots == [utc(2026, 5, 1, 12, 30)]
    assert next_fire_times(quarter, utc(2026, 5, 1, 12, 15), count=1) == [utc(2026, 5, 1, 12, 30)]


def test_after_in_another_zone_is_the_same_instant() -> None:
    tokyo = datetime(2026, 5, 1, 19, 7, tzinfo=ZoneInfo("Asia/Tokyo"))  # 10:07 UTC
    slots = next_fire_times(CronSchedule("*/15 * * * *"), tokyo, count=1)
    assert slots == [utc(2026, 5, 1, 10, 15)]
    assert slots[0].tzinfo is UTC


def test_names_ranges_and_steps() -> None:
    weekdays = CronSchedule("0 9 * jan-mar mon-fri", "Asia/Tokyo")
    # 2026-01-01 is a Thursday; 09:00 JST is 00:00 UTC.
    assert next_fire_times(weekdays, utc(2026, 1, 1), count=3) == [
        utc(2026, 1, 2, 0, 0),
        utc(2026, 1, 5, 0, 0),
        utc(2026, 1, 6, 0, 0),
    ]
    assert next_fire_times(weekdays, utc(2026, 3, 31, 12), count=1) == [utc(2027, 1, 1, 0, 0)]


def test_day_of_month_and_weekday_both_restricted_match_either_like_crontab() -> None:
    """crontab(5): '0 0 13 * 5' runs on the 13th and on every Friday."""
    slots = next_fire_times(CronSchedule("0 0 13 * 5"), utc(2026, 2, 1), count=4)
    assert slots == [utc(2026, 2, 6), utc(2026, 2, 13), utc(2026, 2, 20), utc(2026, 2, 27)]
    slots = next_fire_times(CronSchedule("0 0 13 * 5"), utc(2026, 3, 1), count=2)
    assert slots == [utc(2026, 3, 6), utc(2026, 3, 13)]


def test_sunday_is_0_or_7() -> None:
    assert next_fire_times(CronSchedule("0 0 * * 7"), utc(2026, 1, 1), 1) == [utc(2026, 1, 4)]
    assert next_fire_times(CronSchedule("0 0 * * 0"), utc(2026, 1, 1), 1) == [utc(2026, 1, 4)]


def test_slots_do_not_depend_on_the_process_time_zone() -> None:
    daily = CronSchedule("30 2 * * *", BERLIN)
    expected = next_fire_times(daily, utc(2026, 3, 28), count=3)
    previous = os.environ.get("TZ")
    try:
        os.environ["TZ"] = "America/Los_Angeles"
        time.tzset()
        assert next_fire_times(daily, utc(2026, 3, 28), count=3) == expected
    finally:
        if previous is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = previous
        time.tzset()


# --- slots_between and latest_slot ------------------------------------------------------


def test_slots_between_is_start_exclusive_end_inclusive_and_bounded() -> None:
    hourly = CronSchedule("0 * * * *")
    assert slots_between(hourly, utc(2026, 5, 1, 10), utc(2026, 5, 1, 12), limit=10) == [
        utc(2026, 5, 1, 11),
        utc(2026, 5, 1, 12),
    ]
    assert slots_between(hourly, utc(2026, 5, 1, 10), utc(2026, 5, 2, 10), limit=3) == [
        utc(2026, 5, 1, 11),
        utc(2026, 5, 1, 12),
        utc(2026, 5, 1, 13),
    ]
    assert slots_between(hourly, utc(2026, 5, 1, 10), utc(2026, 5, 1, 10, 59), limit=10) == []
    assert slots_between(hourly, utc(2026, 5, 1, 10), utc(2026, 5, 1, 12), limit=0) == []


def test_latest_slot_finds_the_last_missed_slot() -> None:
    daily = CronSchedule("30 2 * * *", BERLIN)
    assert latest_slot(daily, utc(2026, 1, 1), utc(2026, 3, 29, 12)) == utc(2026, 3, 29, 1, 0)
    assert latest_slot(daily, utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 29)) is None
    yearly = CronSchedule("0 0 1 1 *")
    assert latest_slot(yearly, utc(2020, 6, 1), utc(2026, 6, 1)) == utc(2026, 1, 1)
    assert latest_slot(yearly, utc(2026, 6, 1), utc(2026, 6, 1)) is None
    every_s = IntervalSchedule(1, utc(2026, 1, 1))
    assert latest_slot(every_s, utc(2026, 1, 1), utc(2026, 5, 1, 0, 0, 0)) == utc(2026, 5, 1)
    once = OneOffSchedule(utc(2026, 2, 1))
    assert latest_slot(once, utc(2026, 1, 1), utc(2026, 3, 1)) == utc(2026, 2, 1)
    assert latest_slot(once, utc(2026, 2, 1), utc(2026, 3, 1)) is None


# --- interval and one-off ---------------------------------------------------------------


def test_interval_slots_are_aligned_to_the_anchor() -> None:
    every_90_s = IntervalSchedule(90, utc(2026, 1, 1, 0, 0, 0))
    assert next_fire_times(every_90_s, utc(2026, 1, 1, 0, 2, 0), count=3) == [
        utc(2026, 1, 1, 0, 3, 0),
        utc(2026, 1, 1, 0, 4, 30),
        utc(2026, 1, 1, 0, 6, 0),
    ]
    # A slot exactly at `after` is not "after".
    assert next_fire_times(every_90_s, utc(2026, 1, 1, 0, 3, 0), count=1) == [utc(2026, 1, 1, 0, 4, 30)]


def test_interval_starts_at_the_anchor_and_ignores_sub_seconds() -> None:
    anchor = datetime(2026, 1, 1, 12, 0, 0, 750000, tzinfo=UTC)
    every_10_s = IntervalSchedule(10, anchor)
    assert next_fire_times(every_10_s, utc(2025, 12, 31), count=2) == [
        utc(2026, 1, 1, 12, 0, 0),
        utc(2026, 1, 1, 12, 0, 10),
    ]
    assert slots_between(IntervalSchedule(1, utc(2026, 1, 1)), utc(2026, 1, 1), utc(2026, 1, 1, 0, 0, 3)) == [
        utc(2026, 1, 1, 0, 0, 1),
        utc(2026, 1, 1, 0, 0, 2),
        utc(2026, 1, 1, 0, 0, 3),
    ]


def test_interval_keeps_real_seconds_through_dst() -> None:
    berlin_anchor = datetime(2026, 3, 29, 0, 0, tzinfo=ZoneInfo(BERLIN))
    hourly = IntervalSchedule(3600, berlin_anchor)
    slots = next_fire_times(hourly, utc(2026, 3, 28, 23), count=4)
    assert _gaps(slots) == {timedelta(hours=1)}


def test_one_off_fires_once_if_still_ahead() -> None:
    at = datetime(2026, 3, 29, 3, 0, 0, 500, tzinfo=ZoneInfo(BERLIN))
    once = OneOffSchedule(at)
    assert next_fire_times(once, utc(2026, 3, 1), count=5) == [utc(2026, 3, 29, 1, 0)]
    assert next_fire_times(once, utc(2026, 3, 29, 1, 0), count=5) == []


# --- describe ---------------------------------------------------------------------------


def test_describe_reads_like_a_sentence() -> None:
    assert describe(CronSchedule("30 2 * * *", BERLIN)) == "At 02:30 AM, Europe/Berlin"
    assert describe(CronSchedule("*/15 * * * *")) == "Every 15 minutes, UTC"
    assert (
        describe(IntervalSchedule(900, utc(2026, 1, 1))) == "Every 15 minutes, from 2026-01-01 00:00:00 UTC"
    )
    assert describe(IntervalSchedule(90, utc(2026, 1, 1))).startswith("Every 90 seconds")
    assert describe(IntervalSchedule(3600, utc(2026, 1, 1))).startswith("Every hour,")
    assert describe(OneOffSchedule(datetime(2026, 3, 29, 3, 0, tzinfo=ZoneInfo(BERLIN)))) == (
        "Once at 2026-03-29 01:00:00 UTC"
    )


# --- validation -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "expr",
    [
        "",
        "* * * *",  # 4 fields
        "0 * * * * *",  # croniter reads a 6th field as seconds; crontab does not
        "61 * * * *",
        "0 24 * * *",
        "0 0 30 2 *",  # never fires
        "0 0 L * *",
        "0 0 * * 5L",
        "0 0 * * 1#2",
        "H * * * *",
        "0 0 ? * *",
        "0 0 * foo *",
        "@reboot",
        "0 0 * * *\n* * * * *",
    ],
)
def test_invalid_cron_is_refused_with_a_stable_code(expr: str) -> None:
    with pytest.raises(ScheduleError) as err:
        CronSchedule(expr)
    assert err.value.code == "invalid_cron"
    assert err.value.message


@pytest.mark.parametrize("tz", ["", "Mars/Olympus", "localtime", "../../etc/passwd", "/etc/localtime"])
def test_invalid_time_zone_is_refused(tz: str) -> None:
    with pytest.raises(ScheduleError) as err:
        CronSchedule("0 0 * * *", tz)
    assert err.value.code == "invalid_timezone"


@pytest.mark.parametrize(("every_s", "code"), [(0, "interval_too_short"), (-5, "interval_too_short")])
def test_interval_shorter_than_a_second_is_refused(every_s: int, code: str) -> None:
    with pytest.raises(ScheduleError) as err:
        IntervalSchedule(every_s, utc(2026, 1, 1))
    assert err.value.code == code


@pytest.mark.parametrize("every_s", [1.5, True, "60"])
def test_interval_must_be_whole_seconds(every_s: object) -> None:
    with pytest.raises(ScheduleError) as err:
        IntervalSchedule(every_s, utc(2026, 1, 1))  # type: ignore[arg-type]
    assert err.value.code == "invalid_interval"


def test_naive_datetimes_are_refused() -> None:
    naive = datetime(2026, 1, 1)
    for build in (lambda: IntervalSchedule(60, naive), lambda: OneOffSchedule(naive)):
        with pytest.raises(ScheduleError) as err:
            build()
        assert err.value.code == "naive_datetime"
    with pytest.raises(ScheduleError) as err:
        next_fire_times(CronSchedule("* * * * *"), naive)
    assert err.value.code == "naive_datetime"


def test_validate_schedule_accepts_valid_schedules_and_macros() -> None:
    for schedule in (
        CronSchedule(" 30  2 * * * ", BERLIN),
        CronSchedule("@Weekly", "UTC"),
        IntervalSchedule(1, utc(2026, 1, 1)),
        OneOffSchedule(utc(2026, 1, 1)),
    ):
        assert validate_schedule(schedule) is schedule
    with pytest.raises(ScheduleError) as err:
        validate_schedule("0 0 * * *")  # type: ignore[arg-type]
    assert err.value.code == "invalid_schedule"


# --- oracle: every minute around real DST transitions ------------------------------------

ZONES = ["Europe/Berlin", "America/New_York", "Australia/Lord_Howe", "America/Santiago", "Asia/Tokyo"]
MINUTES = ["*", "*/15", "0", "30", "0,30", "15-45/15", "*/7", "59"]
HOURS = ["*", "2", "1-3", "*/2", "0", "3", "1,2", "23", "0-4"]


def _transitions(zone_name: str, year: int) -> list[datetime]:
    zone = ZoneInfo(zone_name)
    found = []
    moment = datetime(year, 1, 1, tzinfo=UTC)
    previous = moment.astimezone(zone).utcoffset()
    while moment.year == year:
        moment += timedelta(hours=1)
        offset = moment.astimezone(zone).utcoffset()
        if offset != previous:
            found.append(moment)
            previous = offset
    return found or [datetime(year, 6, 1, tzinfo=UTC)]


TRANSITIONS = {zone: _transitions(zone, 2026) for zone in ZONES}


def _every_minute(start: datetime, end: datetime) -> Iterator[datetime]:
    moment = start.replace(second=0) + timedelta(minutes=1)
    while moment <= end:
        yield moment
        moment += timedelta(minutes=1)


def _wall_fires(expr: str, low: datetime, high: datetime) -> set[datetime]:
    """Every naive wall-clock minute in [low, high] at which croniter says `expr` fires (its own iteration:
    croniter.match is get_prev from the minute asked, and re-parsed the expression for each of ~600 minutes per
    example, ~11 s of the test's CPU)."""
    found = set()
    it = croniter(expr, low - timedelta(minutes=1), ret_type=datetime)
    while (moment := it.get_next()) <= high:
        found.add(moment)
    return found


def _vixie_slots(expr: str, zone_name: str, start: datetime, end: datetime) -> list[datetime]:
    """Brute force over every UTC minute: does ISC cron fire at this instant?"""
    zone = ZoneInfo(zone_name)
    minute_field, hour_field = expr.split()[:2]
    wildcard = minute_field.startswith("*") or hour_field.startswith("*")
    walls = [(moment, moment.astimezone(zone).replace(tzinfo=None)) for moment in _every_minute(start, end)]
    # Every wall minute asked about below is within these bounds: the skipped ones lie between a wall and the one
    # of the minute before it (for the first, the start's).
    before_first = (walls[0][0] - timedelta(minutes=1)).astimezone(zone).replace(tzinfo=None)
    fires = _wall_fires(expr, min(before_first, *(wall for _, wall in walls)), max(wall for _, wall in walls))
    slots = []
    for moment, wall in walls:
        if wall in fires:
            first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
            if wildcard or first == moment:
                slots.append(moment)
                continue
        if wildcard:
            continue
        # Fixed-time job: at the end of a spring-forward gap, run the skipped minutes once.
        wall_before = (moment - timedelta(minutes=1)).astimezone(zone).replace(tzinfo=None)
        skipped = wall_before + timedelta(minutes=1)
        while skipped < wall:
            if skipped in fires:
                slots.append(moment)
                break
            skipped += timedelta(minutes=1)
    return slots


@pytest.mark.slow  # brute force over every minute around the transitions
@settings(max_examples=100, deadline=None)
@given(
    st.sampled_from(ZONES),
    st.sampled_from(MINUTES),
    st.sampled_from(HOURS),
    st.integers(0, 1),
    st.integers(-300, 300),
    st.integers(0, 59),
)
def test_slots_match_brute_force_vixie_rules_around_transitions(
    zone_name: str, minute: str, hour: str, which: int, shift_min: int, second: int
) -> None:
    expr = f"{minute} {hour} * * *"
    transitions = TRANSITIONS[zone_name]
    start = transitions[which % len(transitions)] + timedelta(minutes=shift_min, seconds=second)
    end = start + timedelta(hours=8)
    schedule = CronSchedule(expr, zone_name)
    expected = _vixie_slots(expr, zone_name, start, end)
    assert slots_between(schedule, start, end, limit=10_000) == expected
    # Asking again from any slot continues with the next one (no slot lost or repeated).
    for index, slot in enumerate(expected[:-1]):
        assert next_fire_times(schedule, slot, count=1) == [expected[index + 1]]
