"""Node I/O in threads: the same call on many nodes at once, from one pool kept across rollouts."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from django.db import connections

NODE_THREADS = 16
# A node's work done in turn (parallel's `in_turn`) takes ~5-15 ms; one taking longer than this waits on something.
IN_TURN_SLOW_S = 0.25

# Kept across rollouts: starting a thread waits for it to take the interpreter lock, up to a switch interval (5 ms)
# while other threads compute, and a rollout started one per node twice (preflight, apply): a tenth of a shard
# worker's lock time in bench-scale's sustained run went to Thread.start.
_POOL = ThreadPoolExecutor(max_workers=2 * NODE_THREADS, thread_name_prefix="spillway-nodes")


def parallel(fn, items: list, *, in_turn: bool = False, threads: int | None = None) -> list:
    """`fn` on every item, on the pool's threads. `in_turn`: one after the other in this thread, for work that
    computes or makes short system calls on this host and never waits long (local nodes' map updates): spread over
    threads, each of its system calls handed the interpreter lock to another thread and back (futex calls, ~9 ms
    of kernel time per node and route change, against ~5 ms for all of its work in one thread). One item that
    takes longer than IN_TURN_SLOW_S (a node's HAProxy not answering until its socket timeout) hands the rest to
    the threads: each would otherwise wait for it and then for each other. `threads`: at most that many at once,
    on threads of this call's own."""
    if not items:
        return []
    if len(items) == 1:
        return [fn(items[0])]
    if in_turn:
        done = []
        for index, item in enumerate(items):
            started = time.monotonic()
            done.append(fn(item))
            if time.monotonic() - started > IN_TURN_SLOW_S and index + 1 < len(items):
                return done + parallel(fn, items[index + 1:], threads=threads)
        return done
    if threads is not None or threading.current_thread().name.startswith("spillway-nodes"):
        # Called from one of _POOL' own threads: waiting there on the same pool could wait for good.
        with ThreadPoolExecutor(max_workers=min(threads or NODE_THREADS, len(items))) as pool:
            return list(pool.map(fn, items))

    def run(item):  # type: ignore[no-untyped-def]
        try:
            return fn(item)
        finally:
            connections.close_all()  # a query made here leaves no connection behind in a thread that lives on

    return list(_POOL.map(run, items))


def on_this_host(nodes) -> bool:  # type: ignore[no-untyped-def]
    """Every node is a local one (its sockets and files on this host): reading them is short work best done in
    turn (parallel's `in_turn`); a node reached over SSH waits on the network, and threads overlap those waits."""
    return all(getattr(node, "transport", None) == "local" for node in nodes)
