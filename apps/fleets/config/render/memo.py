"""Identity memo for the renderer's node-independent steps (pure; no Django, no I/O).

A rollout renders one revision's snapshot for every node, and the central validation renders it once
more for the reference node. Checking the snapshot and laying out a 100k-route listener's maps take
~1.5 s and do not depend on the node, so the same snapshot object rendered again reuses them.

Keyed by object identity, never by equality: hashing 100k frozen routes costs about as much as the
work saved. The memo holds a strong reference to each key object, so an id is never reused while its
entry lives, and the objects are frozen dataclasses and tuples, so a hit is always the same input.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from functools import wraps
from typing import TypeVar

A = TypeVar("A")
R = TypeVar("R")

SIZE = 4  # a rollout's revision and its rollback target, for a couple of listeners


def by_identity(fn: Callable[[A], R]) -> Callable[[A], R]:
    """Remember `fn(arg)` for the last SIZE distinct argument objects (`is`, not `==`)."""
    entries: list[tuple[A, R]] = []
    lock = threading.Lock()

    @wraps(fn)
    def call(arg: A) -> R:
        with lock:
            for key, result in entries:
                if key is arg:
                    return result
        result = fn(arg)
        with lock:
            entries.insert(0, (arg, result))
            del entries[SIZE:]
        return result

    return call
