"""Long garbage-collection pauses, logged (no Django).

A worker holding fleets' route lanes keeps millions of objects alive (every route, every map entry of the
revisions it rolls out). A collection of the oldest generation walks all of them while every thread of the
process waits: a route change then waits too, with nothing in its own path to explain it. Each pause of at least
SLOW_MS is logged with its generation, so a slow change can be matched to one.
"""

from __future__ import annotations

import gc
import logging
import threading
import time

logger = logging.getLogger("spillway.gc")

SLOW_MS = 100.0
_state = threading.local()  # a collection runs in the thread that triggered it


def _timed(phase: str, info: dict) -> None:
    if phase == "start":
        _state.started = time.perf_counter()
        return
    started = getattr(_state, "started", None)
    _state.started = None
    if started is None:
        return
    paused_ms = (time.perf_counter() - started) * 1000.0
    if paused_ms >= SLOW_MS:
        logger.warning("garbage collection of generation %s paused this process for %.0f ms (%s objects freed)",
                       info.get("generation"), paused_ms, info.get("collected"))


def install() -> None:
    """Log this process's long collections (idempotent)."""
    if _timed not in gc.callbacks:
        gc.callbacks.append(_timed)
