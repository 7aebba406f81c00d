"""Route selection semantics, and the map-file layout that reproduces them for large route counts.

One rule decides which route serves a request (apps.balancers.routing states it: host routes before
any-host routes, then lowest (priority, id); prefix is Gateway API PathPrefix). `resolve_route` is that
rule in Python; the rendered config implements it twice: as ordered `http-request` rules (small
listeners) and as map lookups (large listeners).

The map layout, and why it gives the same answer (measured on HAProxy 2.6.12):
- `map_beg` is a longest-prefix lookup (a prefix tree), not first-match-in-file order.
- `map_end` is first-match in file order; `map_str` is an exact lookup.
A request is first given a *host class*: its own name if some route names it exactly, else the longest
matching wildcard (`map_end`, longest suffix first in the file), else `*`. Every class lists the routes
naming its hosts (exact + matching wildcards); any-host routes are listed once, under `*`, which is looked
up when the request's own class has no match: a route naming a host ranks before every any-host route,
so no any-host route can beat a class's match. The routes map is then keyed by
`<class><path>?` for exact routes and `<class><base>?` + `<class><base>/` for prefix routes (see
`path_keys`), and looked up with `<class><request path>?`: `path` never contains `?` (the query is cut
off), so a `?` key matches only its own path, a `/` key only paths below it (never `/apix` for `/api`),
and `/` after the class stops one class's keys matching another's requests. Finally,
priority becomes longest-prefix: an entry is dropped when a shorter key that is a prefix of it belongs
to a better-ranked route, because that route matches every request the longer key matches. After that,
along any chain of nested keys the rank only improves as keys grow, so the longest match is the
best-ranked route (test_render.py checks this against real HAProxy on a random corpus).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import reduce

from apps.balancers.routing import prefix_base, resolve_route, route_rank  # noqa: F401 (re-exported)

# The routing rule itself (match, rank, shadowing) lives in apps.balancers.routing, shared with the
# route checks and the route tester; this module only lays it out for HAProxy.
from apps.fleets import caches
from apps.fleets.config.render.memo import by_identity
from apps.fleets.config.spec import RouteSpec

ANY_HOST_CLASS = "*"


def ordered_routes(routes: tuple[RouteSpec, ...]) -> list[RouteSpec]:
    return sorted(routes, key=route_rank)


def split_key(targets: list[tuple[int, int]]) -> str:
    """Stable name of a weighted target set: `p<id>` for one pool, `s<id>x<w>_...` for a canary split.

    Weights are reduced by their gcd so 90/10 and 9/1 share rules, and the name depends only on the
    content, so adding a split elsewhere never renames this one (smaller config diffs).
    """
    merged: dict[int, int] = {}
    for pool_id, weight in targets:
        if weight > 0:
            merged[pool_id] = merged.get(pool_id, 0) + weight
    if len(merged) == 1:
        return f"p{next(iter(merged))}"
    divisor = reduce(math.gcd, merged.values())
    return "s" + "_".join(f"{pool_id}x{weight // divisor}" for pool_id, weight in sorted(merged.items()))


def parse_split_key(key: str) -> list[tuple[int, int]]:
    """(pool_id, weight) pairs of a key made by split_key."""
    if key.startswith("p"):
        return [(int(key[1:]), 1)]
    return [(int(a), int(b)) for a, b in (part.split("x") for part in key[1:].split("_"))]


def action_key(route: RouteSpec) -> str:
    """What a matched route does: `u<route id>` (redirect) or a split_key over its targets."""
    return _prepared(route)[2]


def _action_key(route: RouteSpec) -> str:
    if route.redirect_url is not None:
        return f"u{route.id}"
    if len(route.targets) == 1 and route.targets[0].weight > 0:  # what split_key gives, without its dict
        return f"p{route.targets[0].pool_id}"
    return split_key([(t.pool_id, t.weight) for t in route.targets])


# (path key suffixes, rank, action) per route, by value: the next revision's render meets the same 99,999
# routes again (they are frozen and hashable; the values are pure functions of them).
_PREPARED: dict[RouteSpec, tuple[tuple[str, ...], tuple[int, int, int], str]] = caches.register("prepared_routes", {})
_PREPARED_MAX = 500_000


def _prepared(route: RouteSpec) -> tuple[tuple[str, ...], tuple[int, int, int], str]:
    found = _PREPARED.get(route)
    if found is None:
        found = (path_keys(route), route_rank(route), _action_key(route))
        if len(_PREPARED) >= _PREPARED_MAX:
            _PREPARED.clear()
        _PREPARED[route] = found
    return found


@by_identity  # asked for the action keys and for the maps of the same checked routes (memo.py)
def prepared_routes(routes: tuple[RouteSpec, ...]) -> list[tuple[tuple[str, ...], tuple[int, int, int], str]]:
    """_prepared of every route, in order: one by-value lookup per route per render, not one per use
    (hashing a frozen route costs ~1 us, and a render looked each route up twice)."""
    return [_prepared(route) for route in routes]


@dataclass(frozen=True)
class RouteMaps:
    exact_hosts: list[str]  # hosts that are their own class (map_str)
    wildcards: list[tuple[str, str]]  # (".domain", "*.domain"), longest suffix first (map_end)
    entries: list[tuple[str, str]]  # (key, action key), sorted by key (map_beg)
    classes: list[str] = field(default_factory=list)  # each entry's host class (the render manifest's owner)


def _parent_wildcards(host: str, wildcard_set: set[str]) -> list[str]:
    """Wildcard patterns that match `host` (a name or a `*.domain` class), longest first."""
    labels = host.split(".")
    found = []
    for i in range(1, len(labels) - 1):
        candidate = "*." + ".".join(labels[i:])
        if candidate != host and candidate in wildcard_set:
            found.append(candidate)
    return found


def path_keys(route: RouteSpec) -> tuple[str, ...]:
    """The routes-map key suffixes of a route, looked up as `<class><request path>?` with map_beg.

    Exact `/a`: `/a?` (only the path itself is followed by `?`). Prefix `/a`: `/a?` for the path
    itself and `/a/` for everything below it, so `/ax` matches neither (Gateway API PathPrefix).
    Prefix `/`: `/`, which every path starts with.
    """
    if route.path_match == "exact":
        return (route.path + "?",)
    base = prefix_base(route.path)
    return (base + "/", base + "?") if base else ("/",)


def routes_by_pattern(routes) -> tuple[dict[str, list[RouteSpec]], list[RouteSpec]]:  # type: ignore[no-untyped-def]
    """({host pattern: routes naming it}, any-host routes), each in the order given."""
    by_pattern: dict[str, list[RouteSpec]] = {}
    any_host: list[RouteSpec] = []
    for route in routes:
        if not route.hosts:
            any_host.append(route)
        for pattern in route.hosts:
            by_pattern.setdefault(pattern, []).append(route)
    return by_pattern, any_host


def class_members(host_class: str, named, any_host, wildcard_set: set[str]):  # type: ignore[no-untyped-def]
    """The routes a host class's entries come from: those naming it and its parent wildcards (`*`: any-host).
    `named(pattern)` gives the routes naming a pattern."""
    if host_class == ANY_HOST_CLASS:
        return list(any_host)
    members = list(named(host_class))
    for parent in _parent_wildcards(host_class, wildcard_set):
        members += named(parent)
    return members


def class_entries(host_class: str, members, prepared) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """One host class's routes-map entries (key, action), sorted, shadowed keys dropped.

    Classes are independent: every key of a class starts with `<class>/` (or `<class>?`... never: paths
    start with `/`), and `/` is in no hostname, so no key of one class is a prefix of another class's key,
    and in the sorted map each class's keys form one run. The whole map is the runs in the order of
    `<class>/` (build_route_maps), which is why a route change can recompute only its classes
    (render/incremental.py) and still give the whole map's answer.
    `prepared(route)` gives (path key suffixes, rank, action).
    """
    best: dict[str, tuple[tuple[int, int, int], str]] = {}
    for route in members:
        suffixes, rank, action = prepared(route)
        for suffix in suffixes:
            key = host_class + suffix
            current = best.get(key)
            if current is None or rank < current[0]:
                best[key] = (rank, action)
    # Drop entries shadowed by a better-ranked shorter prefix. In sorted order every key's prefixes
    # come before it, so a stack holds exactly the chain of kept-or-dropped keys that prefix it.
    entries: list[tuple[str, str]] = []
    stack: list[tuple[str, tuple[int, int, int]]] = []  # (key, best rank among it and its prefixes)
    for key in sorted(best):
        rank, action = best[key]
        while stack and not key.startswith(stack[-1][0]):
            stack.pop()
        inherited = stack[-1][1] if stack else None
        if inherited is None or rank < inherited:
            entries.append((key, action))
            stack.append((key, rank))
        else:
            stack.append((key, inherited))
    return entries


def class_order(host_class: str) -> str:
    """Where a class's run of keys stands in the sorted routes map (class_entries)."""
    return host_class + "/"


def wildcard_list(wildcard_set: set[str]) -> list[tuple[str, str]]:
    """(".domain", "*.domain"), longest suffix first: map_end is first match in file order."""
    return sorted(((p[1:], p) for p in wildcard_set), key=lambda item: (-len(item[0]), item[0]))


@by_identity  # the same checked listener's routes for every node of a rollout (memo.py)
def build_route_maps(routes: tuple[RouteSpec, ...]) -> RouteMaps:
    by_pattern, any_host = routes_by_pattern(routes)
    wildcard_set = {p for p in by_pattern if p.startswith("*.")}
    exact_hosts = sorted(p for p in by_pattern if not p.startswith("*."))
    # (path key suffixes, rank, action) per route, computed once: wildcard routes count in several classes.
    prepared = {id(route): found for route, found in zip(routes, prepared_routes(routes), strict=True)}
    # Any-host routes only under `*`, looked up when the request's own class has no match (frontends):
    # every route naming a host ranks before every any-host route, so that second lookup gives the same
    # answer, and an any-host route costs two entries instead of two per host class (10,000 at 5,000 hosts).
    host_classes = [*exact_hosts, *wildcard_set, *([ANY_HOST_CLASS] if any_host else [])]
    entries: list[tuple[str, str]] = []
    classes: list[str] = []
    for host_class in sorted(host_classes, key=class_order):
        run = class_entries(host_class, class_members(host_class, lambda p: by_pattern.get(p, ()), any_host,
                                                      wildcard_set),
                            lambda route: prepared[id(route)])
        entries += run
        classes += [host_class] * len(run)
    return RouteMaps(exact_hosts=exact_hosts, wildcards=wildcard_list(wildcard_set), entries=entries,
                     classes=classes)
