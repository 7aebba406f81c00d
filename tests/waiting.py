"""Waiting for something a real process does: one helper for every test (no fixed sleeps where a condition exists).

`wait_for` answers the condition's value (truthy once met, else its last falsy value at the deadline), for
`assert wait_for(...)` and for tests that use what it returned; `wait_until` raises instead, naming what did
not happen. `run_coroutine` runs a coroutine to its end, with a deadline, in a thread of its own.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


def wait_for(predicate: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.05) -> T:
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(interval_s)


def wait_until(predicate: Callable[[], T], timeout_s: float = 10.0, interval_s: float = 0.05,
               what: str = "the condition") -> T:
    value = wait_for(predicate, timeout_s, interval_s)
    if not value:
        raise AssertionError(f"{what} not met within {timeout_s} s")
    return value


def run_coroutine(coroutine) -> None:
    """In a thread of its own: a browser test before may leave an event loop running in this one."""
    with ThreadPoolExecutor(1) as thread:
        thread.submit(asyncio.run, coroutine).result(timeout=30)
