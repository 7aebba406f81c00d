"""A listener's route maps kept current across route-only changes, without laying out every route again.

At 100k routes a full render costs over a second (every route checked, ranked and keyed, ~200k map
entries sorted), while a route change moves a handful of entries. `ListenerRoutes` holds one
listener's routes indexed by host pattern and its routes map as one run of entries per host class,
and `apply` recomputes only the classes the changed routes belong to.

Why the answer is the full render's: `routing.class_entries` is the one function both use for a
class's run; classes are independent (no key of one class is a prefix of another's, see its
docstring), and the whole map is the runs in `class_order`, which is how `build_route_maps` writes it
too. The affected classes of a route are those its old and new versions name, every class under a
wildcard it names (a wildcard's routes count in every class below it), and `*` for any-host routes.
`tests/fleets/test_render_incremental.py` holds `apply` to the full render, byte for byte, on random
changes.

What this cannot do returns None (the caller renders in full): a change of the listener's set of
pool/split actions, which changes haproxy.cfg itself (split ids, per-pool rules), not only maps.
Pure: no Django, no I/O.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain

from apps.fleets.config.render.frontends import (
    MAP_BUCKETS,
    _action_owner,
    listener_action_keys,
    map_bucket,
    map_prefix,
    redirects_map_name,
    routes_map_name,
    split_ids,
)
from apps.fleets.config.render.kept_class import KeptHostClass, Moves, entry_moves
from apps.fleets.config.render.routing import (
    ANY_HOST_CLASS,
    _parent_wildcards,
    _prepared,
    build_route_maps,
    class_entries,
    class_members,
    class_order,
    wildcard_list,
)
from apps.fleets.config.spec import ListenerSpec, Owner, RedirectOwners, RoutesMapOwners, RouteSpec, RunClasses
from apps.fleets.node.mapdelta import MAX_DELTA_KEYS, MapDelta

# A class of this many member routes is kept key by key (KeptHostClass) rather than laid out again at each change. Below
# it, laying a class out again costs tens of microseconds, and keeping every class's candidates (5,000 host classes
# of 20 routes in bench-scale) would add a copy of the listener's keys to the lane's memory for nothing.
LARGE_CLASS = 64


@dataclass(frozen=True)
class MapUpdate:
    """One map file's new contents, its manifest entries and owners, and the key-by-key change from the
    previous contents (None: replace it whole, as node/mapdelta.py would decide)."""

    name: str
    entries: list[tuple[str, str]]
    owners: Sequence[Owner | None]
    content: bytes
    delta: MapDelta | None


def _lines(entries: Iterable[tuple[str, str]]) -> bytes:
    return "".join(f"{key} {value}\n" for key, value in entries).encode()


class ListenerRoutes:
    """One checked HTTP listener's routes and route maps (the map layout of frontends.classify_with_maps)."""

    def __init__(self, listener: ListenerSpec) -> None:
        self.lb = listener.lb
        self.prefix = map_prefix(listener)
        self.default_key = f"p{listener.default_pool_id}" if listener.default_pool_id is not None else None
        keys = listener_action_keys(listener)
        self.keys = set(keys)
        self.ids = split_ids(keys)
        self.routes: dict[int, RouteSpec] = {r.id: r for r in listener.routes}
        self.by_pattern: dict[str, dict[int, RouteSpec]] = {}
        self.wildcards: set[str] = set()  # the wildcard patterns of by_pattern
        self.any_host: dict[int, RouteSpec] = {}
        self.actions: Counter[str] = Counter()
        for route in listener.routes:
            self._index(route, +1)
        maps = build_route_maps(listener.routes)
        # Runs as written (split actions by their short id): the ids stay while the action set does (apply).
        self.runs: dict[str, list[tuple[str, str]]] = {}
        ids = self.ids
        for (key, action), host_class in zip(maps.entries, maps.classes, strict=True):
            self.runs.setdefault(host_class, []).append((key, ids.get(action, action)))
        # Each bucket's classes in map order (frontends.MAP_BUCKETS: a change rewrites only its classes' buckets).
        self.orders: list[list[str]] = [[] for _ in range(MAP_BUCKETS)]
        for host_class in sorted(self.runs, key=class_order):
            self.orders[map_bucket(host_class)].append(host_class)
        self._order_keys = [[class_order(c) for c in order] for order in self.orders]
        self.chunks = {c: self._chunk(run) for c, run in self.runs.items()}
        self.redirects = {f"u{r.id}": r.redirect_url for r in listener.routes if r.redirect_url is not None}
        # Each bucket's redirects map in its written order (keys, entries, lines side by side), kept up to date from
        # the first change that moves it: sorting, formatting and owning 50k redirects again for each new redirect
        # was a lane step's largest cost, and then looking each of them up again (list, join) still half of it.
        self._redirect_order: list[list[str]] | None = None
        self._redirect_entries: list[list[tuple[str, str]]] = [[] for _ in range(MAP_BUCKETS)]
        self._redirect_lines: list[list[bytes]] = [[] for _ in range(MAP_BUCKETS)]
        # {written action: owner} of every pool/split action, made at the first change; it cannot move while the
        # lane continues (apply declines when the listener's keys would), so every revision's owners share it.
        # Redirects own themselves (RoutesMapOwners names the route from the key).
        self._owners: dict[str, Owner] | None = None
        # Classes of LARGE_CLASS routes or more, kept key by key from their first change (render/kept_class.py).
        self._class_runs: dict[str, KeptHostClass] = {}

    # --- index -------------------------------------------------------------------------------------

    def _index(self, route: RouteSpec, sign: int) -> None:
        if sign > 0:
            if route.hosts:
                for pattern in route.hosts:
                    self.by_pattern.setdefault(pattern, {})[route.id] = route
                    if pattern.startswith("*."):
                        self.wildcards.add(pattern)
            else:
                self.any_host[route.id] = route
        else:
            for pattern in route.hosts:
                named = self.by_pattern.get(pattern)
                if named is not None:
                    named.pop(route.id, None)
                    if not named:
                        del self.by_pattern[pattern]
                        self.wildcards.discard(pattern)
            if not route.hosts:
                self.any_host.pop(route.id, None)
        if route.redirect_url is None:
            self.actions[_prepared(route)[2]] += sign
            if self.actions[_prepared(route)[2]] <= 0:
                del self.actions[_prepared(route)[2]]

    def _written(self, action: str) -> str:
        return self.ids.get(action, action)

    @staticmethod
    def _chunk(run: list[tuple[str, str]]) -> bytes:
        return _lines(run)

    def _classes_of(self, route: RouteSpec) -> set[str]:
        if not route.hosts:
            return {ANY_HOST_CLASS}
        found = set(route.hosts)
        for pattern in route.hosts:
            if pattern.startswith("*."):
                suffix = pattern[1:]
                found.update(p for p in self.by_pattern if p.endswith(suffix) and p != pattern)
        return found

    # --- change ------------------------------------------------------------------------------------

    def apply(self, upserts: Iterable[RouteSpec], deletes: Iterable[int]) -> list[MapUpdate] | None:
        """Change the listener's routes (checked routes in, ids out); the maps that changed, or None when
        haproxy.cfg itself would change (the state is then stale: drop it and render in full)."""
        upserts, deletes = list(upserts), list(deletes)
        # The host patterns this change could add or remove (those of its routes, old and new versions), as they
        # were: copying every pattern of a 5,000-host listener to find out cost more than the rest of a change.
        olds = (self.routes.get(i) for i in chain((r.id for r in upserts), deletes))
        named_here = {p for route in chain(upserts, (o for o in olds if o is not None)) for p in route.hosts}
        exact_before = {p for p in named_here if p in self.by_pattern and not p.startswith("*.")}
        wildcards_before = self.wildcards.copy()
        redirects_before: dict[str, str | None] = {}  # the redirects this change touches, as they were
        touched: set[str] = set()
        left: list[int] = []  # ids of the routes whose old version went (deleted or replaced)
        arrived: list[RouteSpec] = []
        for route_id, new in [*((r.id, r) for r in upserts), *((i, None) for i in deletes)]:
            old = self.routes.pop(route_id, None)
            if old is not None:
                left.append(route_id)
                touched |= self._classes_of(old)
                self._index(old, -1)
                key = f"u{old.id}"
                redirects_before.setdefault(key, self.redirects.get(key))
                self.redirects.pop(key, None)
            if new is not None:
                self.routes[route_id] = new
                arrived.append(new)
                self._index(new, +1)
                touched |= self._classes_of(new)
                if new.redirect_url is not None:
                    key = f"u{new.id}"
                    redirects_before.setdefault(key, self.redirects.get(key))
                    self.redirects[key] = new.redirect_url
        redirects_moved = {key: (was, self.redirects.get(key)) for key, was in redirects_before.items()
                           if was != self.redirects.get(key)}
        keys = set(self.actions) | ({self.default_key} if self.default_key else set())
        if keys != self.keys:
            return None  # split ids and per-pool rules in haproxy.cfg move: not a maps-only change
        wildcard_set = self.wildcards
        for host_class in list(touched):  # classes under a wildcard that appeared or went away
            if host_class.startswith("*."):
                suffix = host_class[1:]
                touched.update(p for p in self.by_pattern if p.endswith(suffix))
        if wildcard_set != wildcards_before:
            self._class_runs.clear()  # classes gained or lost a parent wildcard: their members moved wholesale
        updates: list[MapUpdate] = []
        moved: dict[int, Moves] = {}  # by bucket
        any_host = list(self.any_host.values())

        def named(pattern: str) -> list[RouteSpec]:
            return list(self.by_pattern.get(pattern, {}).values())

        for host_class in touched:
            live = host_class in self.by_pattern or (host_class == ANY_HOST_CLASS and bool(self.any_host))
            if not live:
                self._class_runs.pop(host_class, None)
            state = self._class_runs.get(host_class)
            if state is not None:
                parents = set(_parent_wildcards(host_class, wildcard_set))
                moves = state.change(left, [
                    route for route in arrived
                    if (not route.hosts if host_class == ANY_HOST_CLASS else
                        host_class in route.hosts or not parents.isdisjoint(route.hosts))])
                self._set_run(host_class, state.entries, state.chunk())
            else:
                members = class_members(host_class, named, any_host, wildcard_set) if live else []
                if len(members) >= LARGE_CLASS:
                    state = self._class_runs[host_class] = KeptHostClass(host_class, members, _prepared, self._written)
                    run = state.entries
                else:
                    run = [(key, self._written(action))
                           for key, action in class_entries(host_class, members, _prepared)]
                moves = entry_moves(dict(self.runs.get(host_class, ())), run)
                self._set_run(host_class, run, state.chunk() if state is not None else None)
            for mine, theirs in zip(moved.setdefault(map_bucket(host_class), ([], [], [])), moves, strict=True):
                mine += theirs
        for bucket, (added, changed_keys, removed) in sorted(moved.items()):
            delta = MapDelta(tuple(added), tuple(changed_keys), tuple(removed))
            if len(delta):
                updates.append(self._routes_update(bucket, delta if len(delta) <= MAX_DELTA_KEYS else None))
        exact = {p for p in named_here if p in self.by_pattern and not p.startswith("*.")}
        if exact != exact_before:
            hosts = sorted(p for p in self.by_pattern if not p.startswith("*."))
            delta = MapDelta(tuple((h, h) for h in sorted(exact - exact_before)), (),
                             tuple(sorted(exact_before - exact)))
            updates.append(MapUpdate(
                f"{self.prefix}.hosts.map", [(h, h) for h in hosts], [Owner(lb=self.lb, host=h) for h in hosts],
                _lines((h, h) for h in hosts), delta if len(delta) <= MAX_DELTA_KEYS else None))
        if wildcard_set != wildcards_before:
            wildcards = wildcard_list(wildcard_set)
            updates.append(MapUpdate(f"{self.prefix}.wildcards.map", wildcards,
                                     [Owner(lb=self.lb, host=p) for _, p in wildcards], _lines(wildcards), None))
        if redirects_moved:
            updates += self._redirects_updates(redirects_moved)
        return updates

    def _redirects_updates(self, moved: dict[str, tuple[str | None, str | None]]) -> list[MapUpdate]:
        """The redirects maps after `moved` ({key: (value before, value now)}, None: absent), each bucket's in key
        order: one update per bucket a key moved in."""
        by_bucket: dict[int, dict[str, tuple[str | None, str | None]]] = {}
        for key, change in moved.items():
            by_bucket.setdefault(map_bucket(key), {})[key] = change
        if self._redirect_order is None:
            # Built from the redirects as they are now, this change's included.
            self._redirect_order = [[] for _ in range(MAP_BUCKETS)]
            for key in sorted(self.redirects):
                bucket = map_bucket(key)
                self._redirect_order[bucket].append(key)
                self._redirect_entries[bucket].append((key, self.redirects[key]))
                self._redirect_lines[bucket].append(f"{key} {self.redirects[key]}\n".encode())
        else:
            for bucket, mine in by_bucket.items():
                order, entries, lines = (self._redirect_order[bucket], self._redirect_entries[bucket],
                                         self._redirect_lines[bucket])
                for key, (was, now) in mine.items():
                    at = bisect.bisect_left(order, key)
                    if now is None:
                        del order[at], entries[at], lines[at]
                        continue
                    if was is None:
                        order.insert(at, key)
                        entries.insert(at, (key, now))
                        lines.insert(at, f"{key} {now}\n".encode())
                    else:
                        entries[at], lines[at] = (key, now), f"{key} {now}\n".encode()
        updates = []
        for bucket, mine in sorted(by_bucket.items()):
            entries = self._redirect_entries[bucket].copy()  # this revision's: later changes move the kept list
            delta = MapDelta(tuple((k, now) for k, (was, now) in mine.items() if was is None and now is not None),
                             tuple((k, now) for k, (was, now) in mine.items() if was is not None and now is not None),
                             tuple(k for k, (_, now) in mine.items() if now is None))
            updates.append(MapUpdate(redirects_map_name(self.prefix, bucket), entries, RedirectOwners(entries),
                                     b"".join(self._redirect_lines[bucket]),
                                     delta if len(delta) <= MAX_DELTA_KEYS else None))
        return updates

    def _set_run(self, host_class: str, run: list[tuple[str, str]], chunk: bytes | None = None) -> None:
        bucket = map_bucket(host_class)
        order, order_keys = self.orders[bucket], self._order_keys[bucket]
        position = bisect.bisect_left(order_keys, class_order(host_class))
        present = position < len(order) and order[position] == host_class
        if run:
            self.runs[host_class] = run
            self.chunks[host_class] = self._chunk(run) if chunk is None else chunk
            if not present:
                order.insert(position, host_class)
                order_keys.insert(position, class_order(host_class))
        elif present:
            del self.runs[host_class], self.chunks[host_class]
            del order[position], order_keys[position]

    def _routes_update(self, bucket: int, delta: MapDelta | None) -> MapUpdate:
        order = self.orders[bucket]
        runs = [self.runs[c] for c in order]
        entries = list(chain.from_iterable(runs))
        # Each entry's host class, found when an owner is asked for (a list per entry was a lane step's cost).
        classes = RunClasses(order.copy(), map(len, runs))
        content = b"".join(self.chunks[c] for c in order)
        owners = RoutesMapOwners(entries, classes, self._owned(), self.lb)
        return MapUpdate(routes_map_name(self.prefix, bucket), entries, owners, content, delta)

    def _owned(self) -> dict[str, Owner]:
        if self._owners is None:
            # From the listener's keys (its routes' actions and its default pool), which cannot move while the lane
            # continues: the actions in use can (a first route to the default pool).
            self._owners = {self.ids.get(a, a): _action_owner(self.lb, a, self.ids.get(a, a)) for a in self.keys}
        return self._owners

