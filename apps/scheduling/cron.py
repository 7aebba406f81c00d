"""Schedule evaluation for jobs: cron with a time zone, fixed intervals, one-off. Pure, no Django.

Every slot is a UTC-aware datetime truncated to whole seconds. A slot is what makes a
run unique (JobRun is unique on job + scheduled_for), so the same schedule must always
produce the same slots, whatever the process time zone.

Daylight-saving time follows ISC (Vixie) cron 4.1, the cron most Linux hosts run, rather
than Quartz (Quartz skips a fixed-time firing that falls in the spring-forward gap, so a
02:30 daily job would not run at all that day). Vixie cron splits jobs in two:

* Wildcard jobs: the minute or the hour field starts with ``*`` (``*/15 * * * *``,
  ``0 * * * *``, ``@hourly``). They follow the clock as it is: a wall time skipped by
  spring-forward never fires, and a wall time that happens twice at fall-back fires at
  both instants. So an hourly job fires once in every real hour, and ``*/15`` once in
  every real quarter hour.
* Fixed-time jobs: everything else (``30 2 * * *``, ``0 1-5 * * *``). A wall time that
  happens twice fires only at its first occurrence; a wall time inside the spring-forward
  gap fires once, at the first valid instant after the gap (Europe/Berlin, 2026-03-29: a
  02:30 job fires at 03:00 CEST = 01:00 UTC). Several gap times collapse into that one
  slot.

Cron syntax is the portable 5-field one: numbers, ``*``, ``,``, ``-``, ``/``, month and
weekday names, and the macros @yearly @annually @monthly @weekly @daily @midnight
@hourly. croniter's extensions (seconds field, ``L``, ``W``, ``#``, ``H``, ``?``) are
refused so a schedule means the same thing to anyone who knows crontab(5). Day of month
and day of week, when both are restricted, match if either matches (crontab(5)).
"""

from __future__ import annotations

import functools
import heapq
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cron_descriptor import get_description
from croniter import croniter
from croniter.croniter import CroniterError

MIN_INTERVAL_S: Final = 1
DEFAULT_SLOT_LIMIT: Final = 1000

_MACROS: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_FIELD_NAMES: Final = ("minute", "hour", "day of month", "month", "day of week")
_MONTHS: Final = frozenset(
    ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"]
)
_WEEKDAYS: Final = frozenset(["sun", "mon", "tue", "wed", "thu", "fri", "sat"])
_FIELD_CHARS: Final = re.compile(r"^[A-Za-z0-9*,/\-]+$")
# tzdata directories can hold these; they name whatever the host is set to, not a zone.
_HOST_ZONE_FILES: Final = frozenset({"localtime", "posixrules", "Factory"})
# A sliding window wide enough to see any DST fold next to a given instant (see _fold_margin).
_PROBE_SPAN: Final = timedelta(days=2)
_PROBE_STEP: Final = timedelta(minutes=30)


class ScheduleError(ValueError):
    """An invalid schedule; `code` is stable for API errors, `message` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class CronSchedule:
    expr: str  # 5-field cron or a macro such as @daily, read in `tz`
    tz: str = "UTC"  # IANA name

    def __post_init__(self) -> None:
        validate_schedule(self)


@dataclass(frozen=True)
class IntervalSchedule:
    every_s: int
    anchor: datetime  # aware; the first slot, and every slot is anchor + k * every_s

    def __post_init__(self) -> None:
        validate_schedule(self)


@dataclass(frozen=True)
class OneOffSchedule:
    at: datetime  # aware

    def __post_init__(self) -> None:
        validate_schedule(self)


Schedule = CronSchedule | IntervalSchedule | OneOffSchedule


def validate_schedule(schedule: Schedule) -> Schedule:
    """Raise ScheduleError unless `schedule` can fire; return it unchanged.

    The dataclasses call this on construction, so a schedule object that exists is valid.
    Codes: invalid_cron, invalid_timezone, interval_too_short, invalid_interval,
    naive_datetime, invalid_schedule.
    """
    if isinstance(schedule, CronSchedule):
        if not isinstance(schedule.tz, str):
            raise ScheduleError("invalid_timezone", "time zone must be an IANA name such as Europe/Berlin")
        if not isinstance(schedule.expr, str):
            raise ScheduleError("invalid_cron", "cron expression must be text")
        _zone(schedule.tz)
        _parse_cron(schedule.expr)
    elif isinstance(schedule, IntervalSchedule):
        if isinstance(schedule.every_s, bool) or not isinstance(schedule.every_s, int):
            raise ScheduleError("invalid_interval", "every_s must be a whole number of seconds")
        if schedule.every_s < MIN_INTERVAL_S:
            raise ScheduleError(
                "interval_too_short",
                f"an interval must be at least {MIN_INTERVAL_S} s, got {schedule.every_s} s",
            )
        _require_aware(schedule.anchor, "anchor")
    elif isinstance(schedule, OneOffSchedule):
        _require_aware(schedule.at, "at")
    else:
        raise ScheduleError("invalid_schedule", f"not a schedule: {type(schedule).__name__}")
    return schedule


def next_fire_times(schedule: Schedule, after: datetime, count: int = 5) -> list[datetime]:
    """The next `count` slots strictly after `after` (aware), earliest first, in UTC."""
    slots: list[datetime] = []
    if count <= 0:
        return slots
    for slot in _slots_after(schedule, _utc(after, "after")):
        slots.append(slot)
        if len(slots) == count:
            break
    return slots


def slots_between(
    schedule: Schedule,
    start_exclusive: datetime,
    end_inclusive: datetime,
    limit: int = DEFAULT_SLOT_LIMIT,
) -> list[datetime]:
    """Slots in (start_exclusive, end_inclusive], earliest first, at most `limit` of them."""
    end = _utc(end_inclusive, "end_inclusive")
    slots: list[datetime] = []
    if limit <= 0:
        return slots
    for slot in _slots_after(schedule, _utc(start_exclusive, "start_exclusive")):
        if slot > end:
            break
        slots.append(slot)
        if len(slots) == limit:
            break
    return slots


def latest_slot(schedule: Schedule, start_exclusive: datetime, end_inclusive: datetime) -> datetime | None:
    """The last slot in (start_exclusive, end_inclusive], or None.

    For misfire handling ("run once for everything missed"): it does not walk every
    missed slot of an every-second job after a week of downtime.
    """
    start = _utc(start_exclusive, "start_exclusive")
    end = _utc(end_inclusive, "end_inclusive")
    if end <= start:
        return None
    if isinstance(schedule, IntervalSchedule):
        slot = _interval_slot_at_or_before(schedule, end)
        return slot if slot is not None and slot > start else None
    # Look back over a window that doubles until it holds a slot or reaches the start.
    window = timedelta(hours=1)
    while True:
        window_start = max(start, end - window)
        slots = _all_between(schedule, window_start, end)
        if slots:
            return slots[-1]
        if window_start == start:
            return None
        window *= 2


def describe(schedule: Schedule) -> str:
    """A sentence for the UI, e.g. "At 02:30 AM, Europe/Berlin"."""
    if isinstance(schedule, CronSchedule):
        fields, _ = _parse_cron(schedule.expr)
        return f"{get_description(fields)}, {schedule.tz}"
    if isinstance(schedule, IntervalSchedule):
        anchor = _truncate(schedule.anchor.astimezone(UTC))
        return f"Every {_humanize_seconds(schedule.every_s)}, from {anchor:%Y-%m-%d %H:%M:%S} UTC"
    if isinstance(schedule, OneOffSchedule):
        return f"Once at {_truncate(schedule.at.astimezone(UTC)):%Y-%m-%d %H:%M:%S} UTC"
    raise ScheduleError("invalid_schedule", f"not a schedule: {type(schedule).__name__}")


# --- helpers ----------------------------------------------------------------------------


def _require_aware(value: datetime, name: str) -> None:
    if not isinstance(value, datetime) or value.tzinfo is None or value.utcoffset() is None:
        raise ScheduleError("naive_datetime", f"{name} must be a datetime with a time zone")


def _utc(value: datetime, name: str) -> datetime:
    _require_aware(value, name)
    return value.astimezone(UTC)


def _truncate(value: datetime) -> datetime:
    return value.replace(microsecond=0)


@functools.lru_cache(maxsize=1)
def _known_zones() -> frozenset[str]:
    return frozenset(available_timezones()) - _HOST_ZONE_FILES


@functools.lru_cache(maxsize=256)
def _zone(name: str) -> ZoneInfo:
    # ZoneInfo alone would also load host files such as "localtime", whose meaning
    # differs per machine; only IANA keys are portable.
    known = _known_zones()
    try:
        if name in _HOST_ZONE_FILES or (known and name not in known):
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError(
            "invalid_timezone", f"unknown time zone {name!r}; use an IANA name such as Europe/Berlin"
        ) from None


@functools.lru_cache(maxsize=1024)
def _parse_cron(expr: str) -> tuple[str, bool]:
    """(normalized 5-field expression, is a Vixie wildcard job) or ScheduleError."""
    if not isinstance(expr, str) or not expr.strip():
        raise ScheduleError("invalid_cron", "cron expression is empty")
    text = expr.strip()
    if text.startswith("@"):
        expanded = _MACROS.get(text.lower())
        if expanded is None:
            raise ScheduleError(
                "invalid_cron", f"unknown macro {text}; use one of {', '.join(sorted(_MACROS))}"
            )
        text = expanded
    fields = text.split()
    if len(fields) != len(_FIELD_NAMES):
        raise ScheduleError(
            "invalid_cron",
            f"cron needs 5 fields (minute hour day-of-month month day-of-week), got {len(fields)}",
        )
    for index, (value, field_name) in enumerate(zip(fields, _FIELD_NAMES, strict=True)):
        if not _FIELD_CHARS.match(value):
            raise ScheduleError(
                "invalid_cron", f"{field_name} field {value!r}: only digits, names, * , - / are allowed"
            )
        allowed = _MONTHS if index == 3 else _WEEKDAYS if index == 4 else frozenset()
        for word in re.findall(r"[A-Za-z]+", value):
            if word.lower() not in allowed:
                raise ScheduleError("invalid_cron", f"{field_name} field {value!r}: {word!r} is not allowed")
    normalized = " ".join(fields)
    reference = datetime(2000, 1, 1)  # naive on purpose: croniter walks wall-clock time here
    try:
        croniter(normalized, reference).get_next(datetime)
    except CroniterError as exc:
        if "find next date" in str(exc):
            raise ScheduleError("invalid_cron", f"{expr!r} never fires (no such date)") from None
        raise ScheduleError("invalid_cron", f"{expr!r}: {exc}") from None
    wildcard = fields[0].startswith("*") or fields[1].startswith("*")
    return normalized, wildcard


def _slots_after(schedule: Schedule, after: datetime) -> Iterator[datetime]:
    """All slots > `after` (UTC), in order, without end."""
    if isinstance(schedule, CronSchedule):
        yield from _cron_slots_after(schedule, after)
    elif isinstance(schedule, IntervalSchedule):
        yield from _interval_slots_after(schedule, after)
    elif isinstance(schedule, OneOffSchedule):
        at = _truncate(schedule.at.astimezone(UTC))
        if at > after:
            yield at
    else:
        raise ScheduleError("invalid_schedule", f"not a schedule: {type(schedule).__name__}")


def _all_between(schedule: Schedule, start_exclusive: datetime, end_inclusive: datetime) -> list[datetime]:
    slots: list[datetime] = []
    for slot in _slots_after(schedule, start_exclusive):
        if slot > end_inclusive:
            break
        slots.append(slot)
    return slots


def _interval_slots_after(schedule: IntervalSchedule, after: datetime) -> Iterator[datetime]:
    anchor = _truncate(schedule.anchor.astimezone(UTC))
    step = timedelta(seconds=schedule.every_s)
    if after < anchor:
        slot = anchor
    else:
        # Slots are whole seconds, so "> after" is "> after rounded down to the second".
        elapsed = _truncate(after) - anchor
        slot = anchor + step * (_whole_seconds(elapsed) // schedule.every_s + 1)
    while True:
        yield slot
        slot += step


def _interval_slot_at_or_before(schedule: IntervalSchedule, moment: datetime) -> datetime | None:
    anchor = _truncate(schedule.anchor.astimezone(UTC))
    if moment < anchor:
        return None
    elapsed_s = _whole_seconds(_truncate(moment) - anchor)
    return anchor + timedelta(seconds=schedule.every_s * (elapsed_s // schedule.every_s))


def _whole_seconds(delta: timedelta) -> int:
    return delta.days * 86400 + delta.seconds


def _cron_slots_after(schedule: CronSchedule, after: datetime) -> Iterator[datetime]:
    """Walk wall-clock matches in `tz` and map each to UTC by the Vixie rules above.

    Each wall time maps to a primary instant (its only or first occurrence, or the end of
    the gap) and, for wildcard jobs in a fold, a second instant one fold later. Primary
    instants rise with wall time; second instants are held in a heap and released in
    order, which keeps the output sorted.
    """
    fields, wildcard = _parse_cron(schedule.expr)
    zone = _zone(schedule.tz)
    after_wall = after.astimezone(zone).replace(tzinfo=None)
    # A second occurrence later than `after` can belong to a wall time up to one fold
    # earlier than `after`'s own wall time, so start that far back.
    start_wall = after_wall - _fold_margin(zone, after) - timedelta(minutes=1)
    walls = croniter(fields, start_wall)
    held: list[datetime] = []
    last: datetime | None = None
    while True:
        wall: datetime = walls.get_next(datetime)
        primary, second = _instants(wall, zone, wildcard)
        if primary is not None:
            while held and held[0] <= primary:
                slot = heapq.heappop(held)
                if slot > after and slot != last:
                    last = slot
                    yield slot
            if primary > after and primary != last:
                last = primary
                yield primary
        if second is not None:
            heapq.heappush(held, second)


def _instants(wall: datetime, zone: ZoneInfo, wildcard: bool) -> tuple[datetime | None, datetime | None]:
    first = wall.replace(tzinfo=zone, fold=0).astimezone(UTC)
    later = wall.replace(tzinfo=zone, fold=1).astimezone(UTC)
    if first == later:
        return first, None
    if first < later:  # the wall time happens twice (fall-back fold)
        return first, (later if wildcard else None)
    # In the spring-forward gap: zoneinfo resolves fold=0 with the old offset (after the
    # gap) and fold=1 with the new one (before it); the transition lies between.
    if wildcard:
        return None, None
    return _transition(zone, later, first), None


def _transition(zone: ZoneInfo, before: datetime, after: datetime) -> datetime:
    """First whole second in (before, after] whose UTC offset differs from `before`'s."""
    old_offset = before.astimezone(zone).utcoffset()
    low, high = 0, _whole_seconds(after - before)
    while high - low > 1:
        middle = (low + high) // 2
        if (before + timedelta(seconds=middle)).astimezone(zone).utcoffset() == old_offset:
            low = middle
        else:
            high = middle
    return before + timedelta(seconds=high)


def _fold_margin(zone: ZoneInfo, moment: datetime) -> timedelta:
    """Largest UTC-offset swing within two days of `moment` (0 where the zone has no DST)."""
    offsets = set()
    probe = moment - _PROBE_SPAN
    while probe <= moment + _PROBE_SPAN:
        offsets.add(probe.astimezone(zone).utcoffset())
        probe += _PROBE_STEP
    known = [offset for offset in offsets if offset is not None]
    return max(known) - min(known) if known else timedelta(0)


def _humanize_seconds(seconds: int) -> str:
    for unit_s, unit in ((86400, "day"), (3600, "hour"), (60, "minute")):
        if seconds % unit_s == 0:
            amount = seconds // unit_s
            return f"{unit}" if amount == 1 else f"{amount} {unit}s"
    return "second" if seconds == 1 else f"{seconds} seconds"
