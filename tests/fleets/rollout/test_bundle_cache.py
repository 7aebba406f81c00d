"""The rollout's bundle cache (rollout/execute.py `_BundleLRU`): bounded by count and by the map entries it holds,
with the total kept as it goes (summing it on every insert made a route change's rollout O(cache) per node), and
what it evicts freed in a thread of its own, not in the rollout's."""

from __future__ import annotations

import threading
import weakref
from types import SimpleNamespace

import pytest

from apps.fleets import caches
from apps.fleets.rollout import execute


def bundle(entries: int) -> SimpleNamespace:
    return SimpleNamespace(rendered_manifest=SimpleNamespace(maps={"maps/a.map": [("k", "v")] * entries}))


@pytest.fixture
def lru(monkeypatch) -> execute._BundleLRU:
    monkeypatch.setattr(execute, "_BUNDLE_CACHE_SIZE", 3)
    monkeypatch.setattr(execute, "_BUNDLE_CACHE_ENTRIES", 100)
    return execute._BundleLRU()


def test_the_oldest_bundle_goes_first_when_the_count_is_reached(lru) -> None:
    for key in "abcd":
        lru.put((key,), bundle(1))
    assert list(lru) == [("b",), ("c",), ("d",)] and lru.held == 3 * 2
    lru.touch(("b",))  # used again: now the newest
    lru.put(("e",), bundle(1))
    assert list(lru) == [("d",), ("b",), ("e",)]


def test_bundles_go_while_their_entries_pass_the_bound_and_the_total_stays_exact(lru) -> None:
    lru.put(("a",), bundle(40))
    lru.put(("b",), bundle(40))
    assert lru.held == 82
    lru.put(("c",), bundle(40))  # 123 > 100: a goes
    assert list(lru) == [("b",), ("c",)] and lru.held == 82
    lru.put(("b",), bundle(10))  # the same key again: counted once, at its new size
    assert lru.held == 41 + 11 and list(lru) == [("c",), ("b",)]
    lru.put(("huge",), bundle(500))  # larger than the bound alone: kept (the newest), everything older goes
    assert list(lru) == [("huge",)] and lru.held == 501
    lru.touch(("gone",))  # evicted meanwhile by another thread: no error


def test_entries_several_bundles_share_count_once_until_their_last_holder_goes(lru) -> None:
    """A revision's nodes hold one copy of each map (BundleRenderer._share_maps): counted per bundle, 200 nodes at
    100k routes would have passed the bound with ~14 of them."""
    routes = [("k", "v")] * 60
    for key in "abc":
        lru.put((key,), SimpleNamespace(rendered_manifest=SimpleNamespace(maps={"maps/r.map": routes,
                                                                                "maps/own.map": [("n", key)]})))
    assert list(lru) == [("a",), ("b",), ("c",)] and lru.held == 3 + 60 + 3  # not 3 x 62 > 100: all three stay
    lru.put(("a",), bundle(1))  # a's bundle replaced: the shared list still held by b and c
    assert lru.held == 2 + 60 + 2 + (1 + 1)
    lru.put(("d",), bundle(1))  # the count bound: b goes
    lru.put(("e",), bundle(1))  # c goes, the last holder of the shared list
    assert list(lru) == [("a",), ("d",), ("e",)] and lru.held == 3 * 2


def test_the_one_reset_empties_it_and_its_total() -> None:
    execute._BUNDLE_CACHE.put(("t",), bundle(5))
    caches.reset("bundles")
    assert not execute._BUNDLE_CACHE and execute._BUNDLE_CACHE.held == 0


class _Bundle(SimpleNamespace):
    """A bundle that can be watched being freed (SimpleNamespace takes no weak reference)."""


def test_an_evicted_bundle_is_freed_off_the_rollouts_thread(lru) -> None:
    freed_in: list[str] = []
    done = threading.Event()
    old = _Bundle(rendered_manifest=SimpleNamespace(maps={"maps/a.map": [("k", "v")] * 60}))
    weakref.finalize(old, lambda: (freed_in.append(threading.current_thread().name), done.set()))
    lru.put(("a",), old)
    del old
    lru.put(("b",), bundle(60))  # 122 > 100: a goes
    assert list(lru) == [("b",)]
    assert done.wait(5), "the evicted bundle was never freed"
    assert freed_in == ["spillway-release"], freed_in
