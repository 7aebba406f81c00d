"""The dispatcher's pure core: misfire policies, resumption, end dates, DST nights. No database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from apps.scheduling.cron import CronSchedule, IntervalSchedule, OneOffSchedule
from apps.scheduling.planning import RUN_ONCE, SKIP, first_fire_at, plan_due, retry_delay_s, upcoming

T0 = datetime(2026, 5, 4, 12, 0, 0, tzinfo=UTC)
EVERY_SECOND = IntervalSchedule(1, T0)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def test_nothing_is_due_before_the_next_slot() -> None:
    plan = plan_due(EVERY_SECOND, next_fire_at=at(5), now=at(4.9), grace_s=60, misfire_policy=SKIP)
    assert plan.run_slots == [] and plan.catch_up is None and plan.next_fire_at == at(5)


def test_an_on_time_slot_runs_and_the_schedule_moves_past_now() -> None:
    plan = plan_due(EVERY_SECOND, next_fire_at=at(5), now=at(5.004), grace_s=60, misfire_policy=SKIP)
    assert plan.run_slots == [at(5)]
    assert plan.next_fire_at == at(6)
    assert plan.missed is None


def test_a_late_tick_within_grace_runs_every_slot_it_finds() -> None:
    """A dispatcher that stalled 3 s is not a misfire: each slot still gets its run."""
    plan = plan_due(EVERY_SECOND, next_fire_at=at(5), now=at(8.5), grace_s=10, misfire_policy=SKIP)
    assert plan.run_slots == [at(5), at(6), at(7), at(8)]
    assert plan.next_fire_at == at(9)


def test_skip_drops_slots_older_than_grace_and_reports_them() -> None:
    plan = plan_due(EVERY_SECOND, next_fire_at=at(5), now=at(20.2), grace_s=2, misfire_policy=SKIP)
    assert plan.catch_up is None
    assert plan.missed is not None and (plan.missed.first, plan.missed.last) == (at(5), at(18))
    assert plan.run_slots == [at(19), at(20)]  # on time: within 2 s of now
    assert plan.next_fire_at == at(21)


def test_run_once_collapses_missed_slots_into_one_catch_up_at_the_latest_missed_slot() -> None:
    plan = plan_due(EVERY_SECOND, next_fire_at=at(5), now=at(20.2), grace_s=2, misfire_policy=RUN_ONCE)
    assert plan.catch_up == at(18)
    assert plan.run_slots == [at(19), at(20)]
    assert plan.catch_up not in plan.run_slots


def test_daily_job_missed_by_hours_runs_once_or_not_at_all() -> None:
    daily = CronSchedule("0 2 * * *", "UTC")
    slot = datetime(2026, 5, 4, 2, 0, tzinfo=UTC)
    now = datetime(2026, 5, 4, 7, 30, tzinfo=UTC)
    skipped = plan_due(daily, next_fire_at=slot, now=now, grace_s=60, misfire_policy=SKIP)
    assert skipped.run_slots == [] and skipped.catch_up is None and skipped.missed is not None
    caught = plan_due(daily, next_fire_at=slot, now=now, grace_s=60, misfire_policy=RUN_ONCE)
    assert caught.catch_up == slot and caught.run_slots == []
    assert caught.next_fire_at == datetime(2026, 5, 5, 2, 0, tzinfo=UTC)


def test_a_week_of_downtime_for_an_every_second_job_is_one_catch_up_without_walking_every_slot() -> None:
    now = at(7 * 86400 + 0.5)
    plan = plan_due(EVERY_SECOND, next_fire_at=at(1), now=now, grace_s=1, misfire_policy=RUN_ONCE)
    assert plan.catch_up == at(7 * 86400 - 1)
    assert plan.run_slots == [at(7 * 86400)]


def test_a_one_off_fires_once_and_then_has_no_next_slot() -> None:
    once = OneOffSchedule(at(30))
    plan = plan_due(once, next_fire_at=at(30), now=at(30.1), grace_s=60, misfire_policy=SKIP)
    assert plan.run_slots == [at(30)] and plan.next_fire_at is None


def test_end_at_stops_the_schedule() -> None:
    plan = plan_due(EVERY_SECOND, next_fire_at=at(8), now=at(12.5), grace_s=60, misfire_policy=SKIP, end_at=at(9))
    assert plan.run_slots == [at(8), at(9)]
    assert plan.next_fire_at is None


def test_first_fire_is_at_or_after_now_and_start() -> None:
    assert first_fire_at(EVERY_SECOND, now=at(3.5)) == at(4)
    assert first_fire_at(EVERY_SECOND, now=at(3)) == at(3)
    assert first_fire_at(CronSchedule("*/5 * * * *"), now=at(0), start_at=at(3600)) == at(3600)
    assert first_fire_at(OneOffSchedule(at(10)), now=at(11)) is None
    assert first_fire_at(EVERY_SECOND, now=at(3), end_at=at(2)) is None


def test_upcoming_lists_the_stored_next_slot_then_the_ones_after() -> None:
    assert upcoming(IntervalSchedule(60, T0), first=at(120)) == [at(120 + 60 * n) for n in range(5)]
    assert upcoming(EVERY_SECOND, first=None) == []
    assert upcoming(EVERY_SECOND, first=at(1), end_at=at(2)) == [at(1), at(2)]


def test_retry_backoff_doubles_and_is_capped() -> None:
    assert [retry_delay_s(backoff_s=10, failed_attempt=n) for n in (1, 2, 3)] == [10, 20, 40]
    assert retry_delay_s(backoff_s=10, failed_attempt=30) == 3600
    assert retry_delay_s(backoff_s=0, failed_attempt=3) == 0


# --- DST nights through the planner with a fake clock ------------------------------------------

BERLIN_0230 = CronSchedule("30 2 * * *", "Europe/Berlin")


def _walk(schedule: CronSchedule, start: datetime, end: datetime, step: timedelta) -> list[datetime]:
    """Tick the planner every `step` like a dispatcher would; collect every slot it runs."""
    next_fire = first_fire_at(schedule, now=start)
    ran: list[datetime] = []
    now = start
    while now <= end:
        plan = plan_due(schedule, next_fire_at=next_fire, now=now, grace_s=60, misfire_policy=SKIP)
        ran += plan.run_slots
        next_fire = plan.next_fire_at
        now += step
    return ran


def test_berlin_0230_runs_once_at_0300_cest_on_the_spring_forward_night() -> None:
    ran = _walk(BERLIN_0230, datetime(2026, 3, 28, 12, 0, tzinfo=UTC), datetime(2026, 3, 29, 12, 0, tzinfo=UTC),
                timedelta(seconds=20))
    assert ran == [datetime(2026, 3, 29, 1, 0, tzinfo=UTC)]  # 03:00 CEST: 02:30 never happened


def test_berlin_0230_runs_once_at_the_first_0230_on_the_fall_back_night() -> None:
    ran = _walk(BERLIN_0230, datetime(2026, 10, 24, 12, 0, tzinfo=UTC), datetime(2026, 10, 25, 12, 0, tzinfo=UTC),
                timedelta(seconds=20))
    assert ran == [datetime(2026, 10, 25, 0, 30, tzinfo=UTC)]  # 02:30 CEST; not again at 02:30 CET
