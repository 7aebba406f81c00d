"""The dispatcher's pure core: which slots of one job to run now, and where its schedule resumes.

No Django here. The dispatcher passes the job's state and "now"; tests pass a fake now
(for example the night of a DST change) and check the plan without a clock or database.

Misfire rules (like Quartz's misfire threshold):

* A due slot is *on time* if it is at most `grace_s` old when a dispatcher sees it. On-time
  slots always run, one run each: a dispatcher that ticks a little late still runs every
  slot of an every-second job.
* Older slots were *missed* (no dispatcher was running). Policy `skip` drops them; policy
  `run_once` gives them one catch-up run, scheduled for the latest missed slot. Either way
  the plan reports the missed range, so the history can say what happened.

The catch-up slot is chosen deterministically from the job's state (not from the clock), so
two dispatchers racing on the same job would pick the same slot and the unique constraint
would keep one of them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from apps.scheduling import cron

SKIP = "skip"
RUN_ONCE = "run_once"
MAX_SLOTS_PER_TICK = 1000  # more on-time slots than this wait for the next tick
_EPSILON = timedelta(microseconds=1)


@dataclass(frozen=True)
class Missed:
    first: datetime  # the earliest missed slot
    last: datetime  # the latest missed slot
    policy: str


@dataclass(frozen=True)
class Plan:
    run_slots: list[datetime] = field(default_factory=list)  # on-time slots, earliest first
    catch_up: datetime | None = None  # one run for the missed slots (policy run_once)
    missed: Missed | None = None
    next_fire_at: datetime | None = None  # None: nothing left to fire


def first_fire_at(schedule: cron.Schedule, *, now: datetime, start_at: datetime | None = None,
                  end_at: datetime | None = None) -> datetime | None:
    """The first slot at or after `now` (and `start_at`), or None if the schedule has none left."""
    after = now - _EPSILON
    if start_at is not None and start_at - _EPSILON > after:
        after = start_at - _EPSILON
    slots = cron.next_fire_times(schedule, after, count=1)
    return _within_end(slots[0] if slots else None, end_at)


def upcoming(schedule: cron.Schedule, *, first: datetime | None, count: int = 5,
             end_at: datetime | None = None) -> list[datetime]:
    """`first` (the stored next slot) and the slots after it: what the UI shows as "next runs"."""
    if first is None or count <= 0:
        return []
    return [slot for slot in _upcoming(schedule, first, count) if end_at is None or slot <= end_at]


@functools.lru_cache(maxsize=2048)
def _upcoming(schedule: cron.Schedule, first: datetime, count: int) -> tuple[datetime, ...]:
    # Cached: a list page shows the next five times of fifty jobs, which mostly share schedules.
    return (first, *cron.next_fire_times(schedule, first, count=count - 1))


def plan_due(schedule: cron.Schedule, *, next_fire_at: datetime | None, now: datetime, grace_s: int,
             misfire_policy: str, end_at: datetime | None = None) -> Plan:
    """What to do for one job at `now`, given the earliest slot it has not handed out yet."""
    if next_fire_at is None or next_fire_at > now:
        return Plan(next_fire_at=next_fire_at)
    horizon = now if end_at is None else min(now, end_at)
    cutoff = now - timedelta(seconds=grace_s)  # slots before this were missed
    missed: Missed | None = None
    catch_up: datetime | None = None
    if next_fire_at < cutoff:
        last_missed = cron.latest_slot(schedule, next_fire_at - _EPSILON, min(cutoff - _EPSILON, horizon))
        if last_missed is not None:
            missed = Missed(first=next_fire_at, last=last_missed, policy=misfire_policy)
            if misfire_policy == RUN_ONCE:
                catch_up = last_missed
    on_time_after = max(next_fire_at, cutoff) - _EPSILON
    # The usual tick finds one due slot: one walk of the schedule gives it and the next one.
    probe = _probe(schedule, on_time_after)
    if len(probe) < 2 or probe[1] > now:
        run_slots = [slot for slot in probe if slot <= horizon]
        resume = [slot for slot in probe if slot > now]
    else:
        run_slots = cron.slots_between(schedule, on_time_after, horizon, limit=MAX_SLOTS_PER_TICK) \
            if horizon > on_time_after else []
        if len(run_slots) == MAX_SLOTS_PER_TICK:
            resume = cron.next_fire_times(schedule, run_slots[-1], count=1)
        else:
            resume = cron.next_fire_times(schedule, now, count=1)
    next_at = _within_end(resume[0] if resume else None, end_at)
    return Plan(run_slots=run_slots, catch_up=catch_up, missed=missed, next_fire_at=next_at)


def warm(schedule: cron.Schedule, next_fire_at: datetime) -> None:
    """Evaluate ahead of time what an on-time tick at `next_fire_at` will ask for (see `_probe`)."""
    _probe(schedule, next_fire_at - _EPSILON)


@functools.lru_cache(maxsize=4096)
def _probe(schedule: cron.Schedule, after: datetime) -> list[datetime]:
    # Cached: a cron walk with DST handling costs milliseconds, and a burst of jobs on the same
    # schedule asks the same question. The dispatcher warms it between ticks.
    return cron.next_fire_times(schedule, after, count=2)


def retry_delay_s(*, backoff_s: int, failed_attempt: int, cap_s: int = 3600) -> int:
    """Exponential backoff: backoff_s after the first failure, doubling, at most `cap_s`."""
    if backoff_s <= 0:
        return 0
    return min(cap_s, backoff_s * 2 ** max(0, failed_attempt - 1))


def _within_end(slot: datetime | None, end_at: datetime | None) -> datetime | None:
    if slot is None or (end_at is not None and slot > end_at):
        return None
    return slot
