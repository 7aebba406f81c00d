"""The order in which `make test` hands whole test files to its workers, from each file's time in a full run.

The workers take files in collection order (Makefile: --dist loadfile --no-loadscope-reorder), each taking the next
when it is almost done with its own. Ordered by test count instead (xdist's default), a 45 s file that started in the
last minute left one worker idle for minutes: so long files go first and short ones fill in at the end.

Longest first alone put the files that mostly wait (on real processes, timers, a browser: ~70% of the suite's
worker-seconds are in files whose CPU is under WAITING of their wall time) together at the start, where the cores
were busy 65% of the first three minutes, and left the busy ones (PostgreSQL-heavy unit tests, renders) to the end,
four workers on two cores at 99% for two minutes. So waiting and busy files are merged: each kind longest first,
taken in step by the share of its own time handed out so far, and the two kinds end together with their shortest
files. On a machine as fast as the reference, at four workers (2026-11-28): 305-306 s before, 283-298 s after.

`tests/file_durations.json` holds, per file, [seconds of wall time, seconds of CPU] (the worker's and the children
it reaped: a session's browser is left out, and a worker reaped late counts in the test that reaped it, which makes
a few short files look busy); `make test-durations` writes it after a full run.
"""

from __future__ import annotations

import json
import resource
from pathlib import Path

FILE_DURATIONS = Path(__file__).with_name("file_durations.json")
RECORD_ENV = "SPILLWAY_RECORD_DURATIONS"
CPU_PROPERTY = "cpu_s"  # a test's CPU, on its teardown report's user_properties, while recording
WAITING = 0.3  # a file whose CPU is below this share of its wall time mostly waits
UNKNOWN = (5.0, 2.5)  # a new file: somewhere in the middle, busy


def cpu_now() -> float:
    """This process's CPU so far, with the children it has reaped (HAProxy, Celery workers, make run)."""
    mine, reaped = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return mine.ru_utime + mine.ru_stime + reaped.ru_utime + reaped.ru_stime


def recorded(path: Path = FILE_DURATIONS) -> dict[str, tuple[float, float]]:
    """{file: (wall s, CPU s)}; empty when there is no record. A bare number (the record before CPU was kept) is
    the wall time of a busy file."""
    try:
        raw = json.loads(path.read_text())
        return {name: (float(value), float(value)) if isinstance(value, int | float)
                else (float(value[0]), float(value[1])) for name, value in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError, IndexError):  # unreadable: xdist's own order, not a crash
        return {}


def file_order(files: list[str], times: dict[str, tuple[float, float]]) -> list[str]:
    """`files` in the order to hand them out: waiting and busy files merged, each kind longest first."""
    timed = {name: times.get(name, UNKNOWN) for name in files}
    waiting = sorted((n for n, (wall, cpu) in timed.items() if wall > 0 and cpu < WAITING * wall),
                     key=lambda n: -timed[n][0])
    chosen = set(waiting)
    busy = sorted((n for n in timed if n not in chosen), key=lambda n: -timed[n][0])
    totals = [sum(timed[n][0] for n in kind) or 1.0 for kind in (waiting, busy)]
    done, taken, order = [0.0, 0.0], [0, 0], []
    while taken[0] < len(waiting) or taken[1] < len(busy):
        # The kind whose share handed out so far is smaller goes next (the other when it has none left).
        kind = 0 if taken[1] == len(busy) or (taken[0] < len(waiting) and
                                               done[0] / totals[0] <= done[1] / totals[1]) else 1
        name = (waiting, busy)[kind][taken[kind]]
        order.append(name)
        taken[kind] += 1
        done[kind] += timed[name][0]
    return order


def write(totals: dict[str, tuple[float, float]], path: Path = FILE_DURATIONS) -> None:
    lines = (f"{json.dumps(name)}: [{wall:.1f}, {cpu:.1f}]" for name, (wall, cpu) in sorted(totals.items()))
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n")
