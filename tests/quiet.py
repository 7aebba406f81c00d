"""Tests marked `quiet` measure latency or rates under load; while one runs, no other test does.

With more xdist workers than cores, a test that finds a knee or checks a p99 shares the CPU with three others and
fails on slow machines (2026-11-28/29: three of nine four-worker suites failed one, never the same way). Here each
worker holds a shared lock around every test it runs (setup, call and teardown, which is where module fixtures
start and stop their processes), and a quiet test's call holds it exclusively. A turnstile in front gives the
quiet test precedence: once it is waiting, no worker starts another test, so it waits at most for the tests
already running to end.

Both locks are flock(2) on files every worker of one run shares (the parent of the workers' temporary
directories), so two runs on one machine never wait on each other, and a worker that dies drops its locks.
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

MARK = "quiet"


class QuietLock:
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._turnstile = os.open(directory / "quiet-turnstile.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._room = os.open(directory / "quiet-room.lock", os.O_RDWR | os.O_CREAT, 0o600)
        self._sharing = False

    @contextmanager
    def shared(self) -> Iterator[None]:
        """Any number of workers at once, but none starts while a quiet test waits or runs."""
        self._enter_shared()
        try:
            yield
        finally:
            if self._sharing:
                fcntl.flock(self._room, fcntl.LOCK_UN)
                self._sharing = False

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """No other worker in a test meanwhile. Inside shared() it steps out first: two quiet tests each keeping
        their shared hold while waiting for the other's to end would wait for ever."""
        was_sharing = self._sharing
        if was_sharing:
            fcntl.flock(self._room, fcntl.LOCK_UN)
            self._sharing = False
        fcntl.flock(self._turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._room, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(self._room, fcntl.LOCK_UN)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        if was_sharing:
            self._enter_shared()

    def _enter_shared(self) -> None:
        fcntl.flock(self._turnstile, fcntl.LOCK_SH)
        try:
            fcntl.flock(self._room, fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._turnstile, fcntl.LOCK_UN)
        self._sharing = True

    def close(self) -> None:
        os.close(self._turnstile)
        os.close(self._room)


# --- the plugin (tests/conftest.py's pytest_plugins) ---------------------------------------------------------------

_LOCK = pytest.StashKey["QuietLock"]()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARK}: measures latency or rates under load, so no other test runs "
                                       "meanwhile (tests/quiet.py)")


def _lock(config: pytest.Config) -> QuietLock | None:
    if not hasattr(config, "workerinput"):
        return None  # one process: nothing runs beside a test anyway
    if _LOCK not in config.stash:
        # xdist gives each worker <the run's temporary directory>/popen-gwN.
        config.stash[_LOCK] = QuietLock(Path(config.option.basetemp).parent)
    return config.stash[_LOCK]


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    lock = _lock(item.config)
    if lock is None:
        return (yield)
    with lock.shared():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item):
    lock = _lock(item.config)
    if lock is None or item.get_closest_marker(MARK) is None:
        return (yield)
    with lock.exclusive():
        return (yield)


def pytest_unconfigure(config: pytest.Config) -> None:
    lock = config.stash.get(_LOCK, None)
    if lock is not None:
        lock.close()
