"""A map change as the few entries that moved, applied and checked over the runtime API (no Django).

A route change at 100k routes moves a handful of the routes map's ~200k entries. Replacing the whole
map (`prepare/add/commit map`, then `show map` to check it) costs a node hundreds of milliseconds and
grows with the map; setting only the moved keys costs a few socket round trips.

When this is exact: the node's live map holds exactly the old bundle's entries (the engine takes this
path only for a node recorded clean on the old bundle, node/apply.apply_node), every key appears once,
and the map's lookup does not depend on entry order. `map_str` and `map_beg` (a prefix tree, longest
match) do not; `map_end` (the wildcards map, first match in file order) does, so an order-dependent
map, a map with a duplicate key, or a change too large to be cheaper than a swap is replaced whole.

Requests between two commands see some keys moved and others not: each key's own answer is either
the old or the new one. A route change moves the keys of one route's paths, whose answers were each
right before and are right after, which is what `add/del map` gives a running HAProxy anyway.
"""

from __future__ import annotations

import hashlib
import re
import threading
from dataclasses import dataclass
from itertools import repeat

from apps.core.memo import IdentityMemo
from apps.fleets import caches

# Maps whose lookup is first-match in file order (map_end): only ever replaced whole.
ORDERED_MAP_SUFFIXES = (".wildcards.map",)
# Above this many moved keys a whole-map swap (a few 8 kB payloads per 1,000 entries) is cheaper.
MAX_DELTA_KEYS = 500

_GET_MAP_RE = re.compile(r'found=yes, idx=\w+, key="(?P<key>[^"]*)", value="(?P<value>[^"]*)"')


@dataclass(frozen=True)
class MapDelta:
    """What turns one map's old entries into its new ones, key by key."""

    added: tuple[tuple[str, str], ...] = ()
    changed: tuple[tuple[str, str], ...] = ()  # key, new value
    removed: tuple[str, ...] = ()

    def __len__(self) -> int:
        return len(self.added) + len(self.changed) + len(self.removed)


# Every node of a rollout moves the same keys (maps do not depend on the node): computed once per pair of
# map contents (their sha256), not once per node from two 200k-entry dicts.
_DELTAS: dict[tuple[str, str, str], MapDelta | None] = caches.register("map_deltas", {})
_DELTAS_SIZE = 16
_DELTAS_LOCK = threading.Lock()


def file_delta(name: str, old: list[tuple[str, str]], new: list[tuple[str, str]], old_file: bytes,
               new_file: bytes) -> MapDelta | None:
    """map_delta of a map whose files (written from those entries) are `old_file` and `new_file`. (A route-lane
    bundle carries its moved keys itself: ConfigBundle.map_deltas.)"""
    key = (name, hashlib.sha256(old_file).hexdigest(), hashlib.sha256(new_file).hexdigest())
    with _DELTAS_LOCK:
        if key in _DELTAS:
            return _DELTAS[key]
    delta = map_delta(name, old, new)
    with _DELTAS_LOCK:
        _DELTAS[key] = delta
        while len(_DELTAS) > _DELTAS_SIZE:
            del _DELTAS[next(iter(_DELTAS))]
    return delta


def map_delta(name: str, old: list[tuple[str, str]], new: list[tuple[str, str]]) -> MapDelta | None:
    """The key-by-key change from `old` to `new`, or None when the map must be replaced whole."""
    if name.endswith(ORDERED_MAP_SUFFIXES):
        return None
    before, after = dict(old), dict(new)
    if len(before) != len(old) or len(after) != len(new):
        return None  # a duplicate key: `set`/`del map` act on every entry of a key
    added = tuple((k, v) for k, v in new if k not in before)
    changed = tuple((k, v) for k, v in new if k in before and before[k] != v)
    removed = tuple(k for k, _ in old if k not in after)
    delta = MapDelta(added, changed, removed)
    return delta if len(delta) <= MAX_DELTA_KEYS else None


def parse_get_map(answer: str) -> tuple[str, str] | None:
    """(key, value) that `get map` matched, or None for `found=no`."""
    match = _GET_MAP_RE.search(answer)
    return (match.group("key"), match.group("value")) if match else None


# The wanted entries of recent bundles as `show map` lines ("key value"), by the identity of their list (a
# bundle is rendered once per revision and node and kept: rollout.execute.BundleRenderer).
_wanted_lines = IdentityMemo(lambda wanted: frozenset(f"{key} {value}" for key, value in wanted), size=16)


def map_entries(lines: list[str]) -> list[tuple[str, str]]:
    """(key, value) of `show map` lines (HAProxySocket.show_map_lines)."""
    return [(key, value) for key, _, value in map(str.partition, lines, repeat(" "))]


def _split_file(content: bytes) -> frozenset[str]:
    lines = content.decode().split("\n")
    if lines and not lines[-1]:
        lines.pop()
    return frozenset(lines)


# The same lines from a map file's text (a bundle's files[name], written as "key value" lines from its entries:
# render.manifest.map_file, incremental._lines), by the identity of its bytes. Splitting the text is C's work;
# formatting 200k pairs into lines again was a third of a drift check's CPU at 100k routes, once per route-lane
# revision (every revision's routes map is a new list), in the process whose threads roll the changes out.
_file_lines = IdentityMemo(_split_file, size=16)  # ~30 MB each at 100k routes


def same_entries(live: list[str], wanted: list[tuple[str, str]], content: bytes | None = None) -> bool:
    """Whether a live map (its `show map` lines) holds exactly the wanted entries, in any order, duplicates
    counted. `content`: the map file written from `wanted`, when the caller has it (its lines are read from it).

    As sets of lines, which C does nearly alone: sorting both 200k-entry lists, then parsing every line into a
    pair, took most of a drift check's time at 100k routes, every converge, on every node. When neither side
    repeats a line, the maps hold the same entries exactly when the lines only one side has parse to the same
    entries (they can differ only in how an empty value is printed); a repeated line is counted in full."""
    want = _file_lines(content) if content is not None else _wanted_lines(wanted)
    if len(want) != len(wanted) and content is not None:
        want = _wanted_lines(wanted)  # a repeated line, or a file not written from these entries
    have = set(live)
    if len(want) != len(wanted) or len(have) != len(live):
        return sorted(map_entries(live)) == sorted(wanted)
    if have == want:
        return True
    return sorted(map_entries(list(have - want))) == sorted(map_entries(list(want - have)))
