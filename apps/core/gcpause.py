"""Long garbage-collection pauses, logged (no Django).

A worker holding fleets' route lanes keeps millions of objects alive (every route, every map entry of the
revisions it rolls out). A collection of the oldest generation walks all of them while every thread of the
process waits: a route change then waits too, with nothing in its own path to explain it. Each pause of at least
SLOW_MS is logged with its generation, so a slow change can be matched to one.

A long-running process freezes the heap it built while starting (`freeze_startup_heap`): modules, classes, URL
patterns and settings never become garbage, and a full collection walked them all every time.

Work that allocates many acyclic objects at once (a render, a `show stat` parse at thousands of pools) pauses the
collector instead (`collector_paused`), counted across threads.

Freeing a large structure costs as much as walking it: a 100k-route bundle a cache evicts took ~30 ms to free on a
slow 2-core machine, in the thread that rolls the next change out. `release_later` hands such a structure to a
thread that drops it while the caller goes on (its own work then waits on node sockets, not on free()).
"""

from __future__ import annotations

import gc
import logging
import os
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

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
        # Logged from a thread of its own: a collection can start inside a log handler's write, and writing again
        # from its callback would re-enter the stream. SimpleQueue.put is safe there (made for __del__ and such).
        _pauses.put((info.get("generation"), paused_ms, info.get("collected")))


_pauses: queue.SimpleQueue = queue.SimpleQueue()


def _log_pauses() -> None:
    while True:
        generation, paused_ms, collected = _pauses.get()
        logger.warning("garbage collection of generation %s paused this process for %.0f ms (%s objects freed)",
                       generation, paused_ms, collected)


_logger_thread: threading.Thread | None = None


def install() -> None:
    """Log this process's long collections (idempotent)."""
    global _logger_thread
    if _logger_thread is None or not _logger_thread.is_alive():
        _logger_thread = threading.Thread(target=_log_pauses, name="spillway-gc-log", daemon=True)
        _logger_thread.start()
    if _timed not in gc.callbacks:
        gc.callbacks.append(_timed)


_paused_lock = threading.Lock()
_paused_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off while the block runs. Several threads of a worker do this at once (one per node
    read), so the pause is counted: the first thread in turns the collector off, the last one out turns it back
    on if it was on. Per-thread isenabled()/disable() pairs could interleave and leave it off for good."""
    global _paused_depth, _was_enabled
    with _paused_lock:
        if _paused_depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _paused_depth += 1
    try:
        yield
    finally:
        with _paused_lock:
            _paused_depth -= 1
            if _paused_depth == 0 and _was_enabled:
                gc.enable()


def freeze_startup_heap() -> int:
    """Leave everything the process holds now out of the cyclic collector's reach; how many objects that is.

    For a process that has finished starting (imports, URL patterns): in a web process those are ~175k objects, and
    a full collection walking them took 54 ms, during which every request thread of the process waited (a quiet
    tenant's create p99 beside a busy tenant's writes: 104-140 ms before, 52-65 ms after; bench-tenants). What is
    garbage already is collected first; reference counting still frees frozen objects, only a cycle among them
    would outlive its use, and nothing a request builds is frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


_released: queue.SimpleQueue = queue.SimpleQueue()
_releaser_lock = threading.Lock()
_releaser_pid = 0  # the process whose releaser thread runs (a forked child starts its own: _forget_releaser)


def _release_loop(released: queue.SimpleQueue) -> None:
    while True:
        items = released.get()
        try:
            while items:
                items.pop()  # the last reference to each: freed here, in this thread
        except Exception:  # a thread that died would leave every later release queued for good
            logger.exception("release_later was handed a %s, not a list", type(items).__name__)


def release_later(items: list) -> None:
    """Drop `items`' contents in a thread of its own, which empties the list (the caller must hold no other
    reference to them, and may keep the list: a reference the caller still held when the thread dropped its own
    would free them in the caller's thread after all, as handing over the objects themselves did now and then)."""
    global _releaser_pid
    if _releaser_pid != os.getpid():
        with _releaser_lock:
            if _releaser_pid != os.getpid():
                threading.Thread(target=_release_loop, args=(_released,), name="spillway-release",
                                 daemon=True).start()
                _releaser_pid = os.getpid()
    _released.put(items)


def _forget_releaser() -> None:
    """In a forked child: the parent's thread is not there, and its queue and lock may have been copied taken."""
    global _released, _releaser_lock, _releaser_pid
    _released, _releaser_lock, _releaser_pid = queue.SimpleQueue(), threading.Lock(), 0


os.register_at_fork(after_in_child=_forget_releaser)
