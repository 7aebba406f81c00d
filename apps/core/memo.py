"""A function's results remembered by the identity of their argument (no Django).

For large immutable values shared between callers (a 5 MB map's bytes, a bundle's entry list): an entry holds
its argument, so the argument's id is never reused while the entry lives, and an equal but distinct object is
computed again rather than compared.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

A = TypeVar("A")
R = TypeVar("R")


class IdentityMemo(Generic[A, R]):
    """`fn(arg)`, computed once per argument object among the `size` most recently used."""

    def __init__(self, fn: Callable[[A], R], size: int) -> None:
        self._fn, self._size = fn, size
        self._held: OrderedDict[int, tuple[A, R]] = OrderedDict()
        self._lock = threading.Lock()

    def __call__(self, arg: A) -> R:
        key = id(arg)
        with self._lock:
            known = self._held.get(key)
            if known is not None and known[0] is arg:
                self._held.move_to_end(key)
                return known[1]
        result = self._fn(arg)
        with self._lock:
            self._held[key] = (arg, result)
            while len(self._held) > self._size:
                self._held.popitem(last=False)
        return result
