"""One large host class's routes-map run kept across route changes, recomputing only the keys a change moves.

`routing.class_entries` lays a class out from all its members. For a class of thousands of routes (the `*`
class of a listener whose pipelines add any-host routes, or a busy wildcard) that is ~9 ms per change at
3,000 routes, sorting 6,000 keys and formatting every line again, and every lane step that touches the class
paid it: at 1,000 changes a minute it was the largest part of a shard worker's render.

`KeptHostClass` keeps, per key, every member's candidate (rank, action), the best one, the sorted keys and the kept
entries. class_entries keeps a key when its best rank beats the best of every shorter key that prefixes it, so
a key's fate depends only on its own best and its prefixes'. When a change moves some keys' best, only those
keys and the keys they prefix can change, and in sorted order the keys a key prefixes follow it in one run:
`change` recomputes those runs, seeded with the best rank among the key's own prefixes, and nothing else.
`tests/fleets/test_render_incremental.py` holds the result to the full render on random changes.
Pure: no Django, no I/O.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, Iterable

from apps.fleets.config.render.routing import class_entries
from apps.fleets.config.spec import RouteSpec

Rank = tuple[int, int, int]
Prepared = Callable[[RouteSpec], tuple[tuple[str, ...], Rank, str]]
Moves = tuple[list[tuple[str, str]], list[tuple[str, str]], list[str]]  # added, changed (key, new value), removed


def entry_moves(before: dict[str, str], now: list[tuple[str, str]]) -> Moves:
    """The entries added, changed and removed from `before` (key: value) to `now` (in key order)."""
    after = dict(now)
    return ([(k, v) for k, v in now if k not in before],
            [(k, v) for k, v in now if k in before and before[k] != v],
            [k for k in before if k not in after])


class KeptHostClass:
    """A host class's kept entries (key, written action), in key order, and their map lines."""

    def __init__(self, host_class: str, members: Iterable[RouteSpec], prepared: Prepared,
                 written: Callable[[str], str]) -> None:
        self.host_class = host_class
        self._prepared = prepared
        self._written = written
        self.members: dict[int, RouteSpec] = {}
        self._candidates: dict[str, list[tuple[Rank, str]]] = {}  # key: every member's (rank, action), best first
        for route in members:
            self._join(route)
        self._best = {key: found[0] for key, found in self._candidates.items()}
        self._keys = sorted(self._best)
        run = class_entries(host_class, self.members.values(), prepared)
        self._kept = [key for key, _ in run]
        self.entries = [(key, written(action)) for key, action in run]
        self._lines = [f"{key} {value}\n".encode() for key, value in self.entries]

    def chunk(self) -> bytes:
        return b"".join(self._lines)

    def _join(self, route: RouteSpec) -> set[str]:
        if route.id in self.members:  # named twice in one class (a host and its parent wildcard): once is enough
            return set()
        self.members[route.id] = route
        suffixes, rank, action = self._prepared(route)
        keys = {self.host_class + suffix for suffix in suffixes}
        for key in keys:
            bisect.insort(self._candidates.setdefault(key, []), (rank, action))
        return keys

    def _leave(self, route_id: int) -> set[str]:
        route = self.members.pop(route_id, None)
        if route is None:
            return set()
        suffixes, rank, action = self._prepared(route)
        keys = {self.host_class + suffix for suffix in suffixes}
        for key in keys:
            found = self._candidates[key]
            found.remove((rank, action))
            if not found:
                del self._candidates[key]
        return keys

    def change(self, leaving: Iterable[int], arriving: Iterable[RouteSpec]) -> Moves:
        """Members out (ids; those that are not members are ignored), then members in; the entries that moved."""
        touched: set[str] = set()
        for route_id in leaving:
            touched |= self._leave(route_id)
        for route in arriving:
            touched |= self._join(route)
        roots: list[str] = []  # keys whose best moved, none of them prefixed by another
        for key in sorted(touched):
            found = self._candidates.get(key)
            best = found[0] if found else None
            was = self._best.get(key)
            if best == was:
                continue
            if best is None:
                del self._best[key]
                del self._keys[bisect.bisect_left(self._keys, key)]
            else:
                if was is None:
                    bisect.insort(self._keys, key)
                self._best[key] = best
            if not (roots and key.startswith(roots[-1])):  # sorted: a root's descendants follow it
                roots.append(key)
        moves: Moves = ([], [], [])
        for root in roots:
            self._redo(root, moves)
        return moves

    def _redo(self, root: str, moves: Moves) -> None:
        """Recompute the kept entries among `root` and the keys it prefixes (class_entries' shadowing pass)."""
        best, keys = self._best, self._keys
        inherited: Rank | None = None  # the best rank among root's own prefixes (all of them come before it)
        for end in range(len(self.host_class) + 1, len(root)):
            prefix = best.get(root[:end])
            if prefix is not None and (inherited is None or prefix[0] < inherited):
                inherited = prefix[0]
        # "" prefixes every key, so the seed stays at the bottom of the stack.
        stack: list[tuple[str, Rank]] = [("", inherited)] if inherited is not None else []
        kept: list[tuple[str, str]] = []
        at = bisect.bisect_left(keys, root)
        while at < len(keys) and keys[at].startswith(root):
            key = keys[at]
            rank, action = best[key]
            while stack and not key.startswith(stack[-1][0]):
                stack.pop()
            over = stack[-1][1] if stack else None
            if over is None or rank < over:
                kept.append((key, self._written(action)))
                stack.append((key, rank))
            else:
                stack.append((key, over))
            at += 1
        low = bisect.bisect_left(self._kept, root)
        high = low
        while high < len(self._kept) and self._kept[high].startswith(root):
            high += 1
        for mine, found in zip(moves, entry_moves(dict(self.entries[low:high]), kept), strict=True):
            mine += found
        self._kept[low:high] = [key for key, _ in kept]
        self.entries[low:high] = kept
        self._lines[low:high] = [f"{key} {value}\n".encode() for key, value in kept]
