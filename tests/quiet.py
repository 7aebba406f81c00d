"""Tests marked `quiet` measure latency or rates under load: while one runs, it runs ahead of the other tests, or
with at most one other test beside it.

With more xdist workers than cores, a test that finds a knee or checks a p99 shares the CPU with three others and
fails on slow machines (2026-11-28/29: three of nine four-worker suites failed one, never the same way). With one
other test beside it, as in a run of one worker per core, none did, but the two idle workers cost a run ~30-60 s.

Where the machine allows it (CAP_SYS_NICE and the kernel's autogroups: root on CI's machines), a quiet test's call
runs ahead instead (`boosted`): each worker is a session of its own, and for the call the quiet test's session and
those of its children run at nice -10 while the other workers go on at 0 (the kernel shares the CPU between
sessions by their nice). Elsewhere, every test a worker runs (setup, call and teardown, which is where module
fixtures start and stop their processes) sits in one of the run's seats, one per worker, and a quiet test's call
takes all seats but one (BESIDE) for itself:

* `intent`: a quiet test that wants its seats holds it; no test starts meanwhile, so the quiet test waits only for
  the tests already running to end, down to BESIDE of them;
* `queue`: one quiet test at a time wants seats, so a second one waits without stopping the rest. Boosted quiet tests
  take the queue too: two of them never run at once.

All are flock(2) on files every worker of one run shares (the parent of the workers' temporary directories), so two
runs on one machine never wait on each other, and a worker that dies drops its locks. Each wait is written down and
the run's summary says what quiet tests cost (pytest_terminal_summary).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.autogroups import can_boost

MARK = "quiet"
BESIDE = 1  # tests that may run beside a quiet one (--quiet-beside): a run of one worker per core never failed one
POLL_S = 0.02
WAITS_FILE = "quiet-waits.jsonl"


class QuietLock:
    def __init__(self, directory: Path, seats: int, beside: int = BESIDE, boost: bool = False) -> None:
        directory.mkdir(parents=True, exist_ok=True)

        def lock_file(name: str) -> int:
            return os.open(directory / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)

        self._intent, self._queue = lock_file("quiet-intent.lock"), lock_file("quiet-queue.lock")
        self._seats = [lock_file(f"quiet-seat-{n}.lock") for n in range(seats)]
        self._seat: int | None = None
        self._beside = beside
        self._boost = boost
        self._log = directory / WAITS_FILE
        self._open = True
        # A child forked from the worker (a test's fork) must not keep its seat held should the worker die first.
        os.register_at_fork(after_in_child=self._forget)

    @contextmanager
    def seat(self) -> Iterator[None]:
        """One of the run's seats for a test: taken at once, unless a quiet test wants or holds them."""
        self._note("test", self._sit())
        try:
            yield
        finally:
            self._stand()

    @contextmanager
    def quiet(self) -> Iterator[dict[str, float]]:
        """All seats but `beside`, and its sessions ahead of the others' if it boosts. Inside seat() it gives up its
        own first (two quiet tests each keeping a seat while waiting for the other's would wait for ever) and takes
        one again after, whatever the test did. Yields its waits in seconds: "room" now, "seat" once it is back in
        one."""
        had_seat = self._seat is not None
        waits = {"room": 0.0, "seat": 0.0}
        if had_seat:
            self._stand()
        try:
            started = time.monotonic()
            fcntl.flock(self._queue, fcntl.LOCK_EX)
            held: list[int] = []
            try:
                fcntl.flock(self._intent, fcntl.LOCK_EX)
                try:
                    wanted = len(self._seats) - self._beside
                    while len(held) < wanted:
                        for fd in self._seats:
                            if len(held) < wanted and fd not in held and _try(fd):
                                held.append(fd)  # no more than wanted: the seats left are the room beside it
                        if len(held) < wanted:
                            time.sleep(POLL_S)
                finally:
                    fcntl.flock(self._intent, fcntl.LOCK_UN)
                waits["room"] = time.monotonic() - started
                try:
                    with boosted() if self._boost else contextlib.nullcontext():
                        yield waits
                finally:
                    self._note("quiet", waits["room"], time.monotonic() - started - waits["room"], self._beside,
                               self._boost)
            finally:
                for fd in held:
                    fcntl.flock(fd, fcntl.LOCK_UN)
                fcntl.flock(self._queue, fcntl.LOCK_UN)
        finally:
            if had_seat:
                waits["seat"] = self._sit()
                self._note("test", waits["seat"])

    def _sit(self) -> float:
        started = time.monotonic()
        fcntl.flock(self._intent, fcntl.LOCK_SH)
        try:
            while self._seat is None:
                self._seat = next((n for n, fd in enumerate(self._seats) if _try(fd)), None)
                if self._seat is None:
                    time.sleep(POLL_S)
        finally:
            fcntl.flock(self._intent, fcntl.LOCK_UN)
        return time.monotonic() - started

    def _stand(self) -> None:
        if self._seat is not None:
            fcntl.flock(self._seats[self._seat], fcntl.LOCK_UN)
            self._seat = None

    def _note(self, kind: str, waited: float, held: float = 0.0, beside: int | None = None,
              boosted: bool = False) -> None:
        if kind == "test" and waited < POLL_S:
            return  # sat at once
        with open(self._log, "a") as log:
            log.write(json.dumps([kind, round(waited, 3), round(held, 3), beside, boosted]) + "\n")

    def close(self) -> None:
        self._forget()

    def _forget(self) -> None:
        if self._open:  # once: the numbers may name other files afterwards
            self._open = False
            for fd in [self._intent, self._queue, *self._seats]:
                with contextlib.suppress(OSError):
                    os.close(fd)


# --- ahead of the others: the kernel's autogroups ------------------------------------------------------------------
# Linux shares the CPU between sessions first (autogroups: sched_autogroup_enabled), then between the processes of a
# session by their nice. Each worker is a session of its own (_own_session), so a quiet test's worker, and the
# sessions its children started (a node's HAProxy, a load generator's server), can be set ahead of every other
# session for the test's call: at nice -10 a busy session there gets ~9 times the CPU of one at 0 when both want it.
# A busy loop beside three others on 2 cores got 0.99 of a core that way instead of 2/3 (2026-11-29). Setting a
# session below 0 takes CAP_SYS_NICE: without it (or without autogroups) quiet tests keep the seats' rule alone.

BOOST_NICE = -10


def _own_session() -> None:
    """This worker in a session of its own, so that boosting it boosts no other worker."""
    if os.getsid(0) != os.getpid():
        with contextlib.suppress(OSError):  # already a process group's leader: it stays where it is
            os.setsid()


def autogroup(pid: int) -> tuple[str, int] | None:
    """`pid`'s session as the kernel names it, and its nice ("/autogroup-85 nice 0"); None once it is gone."""
    try:
        with open(f"/proc/{pid}/autogroup") as handle:
            name, _, nice = handle.read().split()
        return name, int(nice)
    except (OSError, ValueError):
        return None


def _set_nice(pid: int, nice: int) -> bool:
    try:
        with open(f"/proc/{pid}/autogroup", "w") as handle:
            handle.write(str(nice))
    except OSError:
        return False
    return True


@contextmanager
def boosted(follow_s: float = 0.2) -> Iterator[None]:
    """This process's session and every session its descendants are in at BOOST_NICE, looked for again every
    `follow_s` (a session started meanwhile); each back to the nice it had after."""
    from apps.fleets.config.check import descendants  # the walk down /proc that local nodes' pre-checks use

    before: dict[str, int] = {}  # session -> its nice before
    members: dict[str, dict[int, None]] = {}  # session -> the processes seen in it (any one still running sets it)

    def boost() -> None:
        for pid in descendants({os.getpid()}):
            found = autogroup(pid)
            if found is None:
                continue
            name, nice = found
            members.setdefault(name, {})[pid] = None
            if name not in before and _set_nice(pid, BOOST_NICE):
                before[name] = nice

    boost()
    done = threading.Event()

    def follow() -> None:
        while not done.wait(follow_s):
            boost()

    follower = threading.Thread(target=follow, name="quiet-boost", daemon=True)
    follower.start()
    try:
        yield
    finally:
        done.set()
        follower.join()
        for name, nice in before.items():
            for pid in members[name]:  # the first still in that session sets it back
                if autogroup(pid) == (name, BOOST_NICE) and _set_nice(pid, nice):
                    break


def _try(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def cost(directory: Path) -> str | None:
    """What the run's quiet tests cost, from the waits its workers wrote down; None when no quiet test ran."""
    try:
        rows = [json.loads(line) for line in (directory / WAITS_FILE).read_text().splitlines()]
    except FileNotFoundError:
        return None
    quiet = [row for row in rows if row[0] == "quiet"]
    if not quiet:
        return None
    waited = sum(row[1] for row in rows if row[0] == "test")
    beside = max(row[3] for row in quiet)
    ahead = f" ahead of the others (their sessions at nice {BOOST_NICE})" if all(row[4] for row in quiet) else ""
    return (f"quiet tests: {len(quiet)} ran{ahead} with room for at most {beside} "
            f"other{'s' * (beside != 1)} beside, "
            f"{sum(r[2] for r in quiet):.1f} s; they waited {sum(r[1] for r in quiet):.1f} s for room, "
            f"tests {waited:.1f} s for seats")


# --- the plugin (tests/conftest.py's pytest_plugins) ---------------------------------------------------------------

_LOCK = pytest.StashKey[QuietLock]()
_BOOSTING = pytest.StashKey[bool]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--quiet-beside", type=int, default=None, metavar="N",
                     help=f"tests that may run beside a quiet one (default: all where quiet tests are boosted, else "
                          f"{BESIDE})")
    parser.addoption("--quiet-boost", choices=("auto", "off"), default="auto",
                     help="set a quiet test's sessions ahead of the others' where the machine allows it (auto)")


def pytest_configure(config: pytest.Config) -> None:
    beside = config.getoption("quiet_beside")
    if beside is not None and beside < 0:
        raise pytest.UsageError("--quiet-beside: a count of tests, 0 or more")
    # Only a worker of a run boosts: one process alone has no other test beside it, and no session of its own.
    boosting = hasattr(config, "workerinput") and config.getoption("quiet_boost") == "auto" and can_boost()
    if boosting:
        _own_session()
        boosting = _boost_works()
    config.stash[_BOOSTING] = boosting
    config.addinivalue_line("markers", f"{MARK}: measures latency or rates under load, so few other tests run "
                                       "meanwhile (tests/quiet.py)")


def _boost_works() -> bool:
    """Whether this worker leads its own session and the kernel takes a nice below 0 for it (tried, then undone):
    where it does not, quiet tests keep the seats' rule rather than run beside every other test unboosted."""
    found = autogroup(os.getpid())
    if os.getsid(0) != os.getpid() or found is None or not _set_nice(os.getpid(), BOOST_NICE):
        return False
    return _set_nice(os.getpid(), found[1])


def _boosting(config: pytest.Config) -> bool:
    return config.stash.get(_BOOSTING, False)


def _lock(config: pytest.Config) -> QuietLock | None:
    if not hasattr(config, "workerinput"):
        return None  # one process: nothing runs beside a test anyway
    if _LOCK not in config.stash:
        seats = config.workerinput["workercount"]
        beside = config.getoption("quiet_beside")
        if beside is None:
            beside = seats - 1 if _boosting(config) else BESIDE
        # xdist gives each worker <the run's temporary directory>/popen-gwN.
        config.stash[_LOCK] = QuietLock(Path(config.option.basetemp).parent, seats, beside, _boosting(config))
    return config.stash[_LOCK]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    lock = _lock(item.config)
    if lock is None:
        return (yield)
    with lock.seat():
        return (yield)


_WAITS = pytest.StashKey[dict[str, float]]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    lock = _lock(item.config)
    if lock is None or item.get_closest_marker(MARK) is None:
        return (yield)
    # Its queue even where every other test may run beside it: two quiet tests never run at once.
    with lock.quiet() as waits:
        item.stash[_WAITS] = waits
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    """A quiet test's call lasted as long as it ran, not as long as it waited: --durations and
    tests/file_durations.json (which orders the files) read it."""
    report = yield
    if call.when == "call" and _WAITS in item.stash:
        report.duration = max(report.duration - sum(item.stash[_WAITS].values()), 0.0)
    return report


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        line = cost(config._tmp_path_factory.getbasetemp())
        if line:
            terminalreporter.write_line(line)


def pytest_unconfigure(config: pytest.Config) -> None:
    lock = config.stash.get(_LOCK, None)
    if lock is not None:
        lock.close()
