"""Which route serves a request: the one routing rule the renderer, the route tester and the route
checks all answer from. Pure (no Django): routes are anything with the RouteLike attributes.

The rule (Gateway API semantics where they apply):
- Host: the Host header without its port, lower-cased. A route names exact hosts, `*.domain`
  patterns (one or more labels below `domain`, never `domain` itself), or no hosts (any host).
- Path: `exact` is exact. `prefix` is Gateway API `PathPrefix`: prefix `/api` matches `/api` and
  `/api/...`, never `/apix`; a trailing slash is ignored (`/api/` is the prefix `/api`), and `/`
  matches every path. The query string is never part of the path.
- Order: among matching routes the lowest rank wins, rank = (any-host?, priority, id). A route that
  names its hosts is always tried before an any-host route. On a shared load balancer hostnames are
  owned by one tenant each (claims never overlap), so two tenants' host routes never match the same
  request, and the only routes that do overlap across tenants are operator any-host fallbacks, which
  rank after every host route: a tenant's priorities therefore order only its own routes.
- A route that can never match (every host and path it covers is matched first by a better-ranked
  route) is refused on save: `shadowing_routes` finds the routes that shadow it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Protocol, TypeVar

MAX_PRIORITY = 50_000


class RouteLike(Protocol):
    @property
    def id(self) -> int: ...
    @property
    def priority(self) -> int: ...
    @property
    def hosts(self) -> Sequence[str]: ...
    @property
    def path_match(self) -> str: ...
    @property
    def path(self) -> str: ...


R = TypeVar("R", bound=RouteLike)


@dataclass(frozen=True)
class RouteRow:
    """The fields the rule reads, as loaded from the database (a RouteLike)."""

    id: int
    priority: int
    hosts: tuple[str, ...]
    path_match: str
    path: str


def route_rank(route: RouteLike) -> tuple[int, int, int]:
    return (0 if route.hosts else 1, route.priority, route.id)


def normalize_host(host_header: str) -> str:
    """The host the config matches on: Host header without port, lower-cased (HAProxy: field(1,:),lower)."""
    return host_header.split(":", 1)[0].lower()


def prefix_base(path: str) -> str:
    """A prefix route's path without trailing slashes: `/api/` -> `/api`, `/` -> `` (matches all)."""
    return path.rstrip("/")


def related_bases(path: str) -> tuple[list[str], str | None]:
    """Which stored paths can cover or be covered by a route on `path`, as bases (prefix_base of a stored
    path): (the bases that may cover it: its ancestors and itself, the base whose descendants it may
    cover, or None when it may cover every path). A superset for exact and prefix routes alike, so
    a write loads these few routes, not every route of its scope (apps.balancers.services)."""
    cut = [path[:i] for i, char in enumerate(path) if char == "/"]
    ancestors = sorted({prefix_base(p) for p in [*cut, path]})
    base = prefix_base(path)
    return ancestors, (base or None)


def covering_hosts(hosts: Iterable[str]) -> list[str]:
    """The host patterns a route may hold to match a request of one of `hosts` (names or `*.domain`): each of them
    and every wildcard above it (`a.b.c` -> `a.b.c`, `*.b.c`, `*.c`)."""
    found = set()
    for host in hosts:
        found.add(host)
        labels = (host[2:] if host.startswith("*.") else host).split(".")
        found.update("*." + ".".join(labels[i:]) for i in range(1, len(labels)))
    return sorted(found)


def related_hosts(hosts: Iterable[str]) -> tuple[list[str], list[str]]:
    """Which host routes can share a request with a route naming `hosts`: (the patterns that may cover one of them,
    covering_hosts; the domains below which a route may be covered by one of its wildcards). For a write that
    loads these routes, not every host route of its tenant (apps.balancers.services); `host_related` decides the same
    in Python."""
    return covering_hosts(hosts), sorted({h[2:] for h in hosts if h.startswith("*.")})


def host_related(route_hosts: Iterable[str], covering: Collection[str], below: Iterable[str]) -> bool:
    """A route naming `route_hosts` holds one of `covering` (a set, for a caller asking of many routes) or a pattern
    under one of the `below` domains."""
    suffixes = tuple(f".{d}" for d in below)
    return any(h in covering or h.endswith(suffixes) for h in route_hosts)


def hosts_behind(loaded: Iterable[RouteLike], candidate: RouteLike) -> list[str]:
    """The patterns that may cover the other hosts of the routes `candidate` could leave never serving (ranked
    after it, on paths it covers): newly_shadowed weighs those routes' other covers too, which need not share a
    host with `candidate`. `loaded`: the routes related_hosts named."""
    rank = route_rank(candidate)
    return covering_hosts(h for r in loaded if route_rank(r) > rank and _path_covers(candidate, r) for h in r.hosts)


def host_matches(pattern: str, host: str) -> bool:
    if pattern.startswith("*."):
        return host.endswith(pattern[1:])
    return host == pattern


def path_matches(route: RouteLike, path: str) -> bool:
    if route.path_match == "exact":
        return path == route.path
    base = prefix_base(route.path)
    return not base or path == base or path.startswith(base + "/")


def route_matches(route: RouteLike, host: str, path: str) -> bool:
    """`host` already normalized."""
    return (not route.hosts or any(host_matches(p, host) for p in route.hosts)) and path_matches(route, path)


def resolve_route(routes: Iterable[R], host_header: str, path: str) -> R | None:
    """The route that serves a request, or None (then the listener's default pool or its no-route answer)."""
    host = normalize_host(host_header)
    best: R | None = None
    for route in routes:
        if (best is None or route_rank(route) < route_rank(best)) and route_matches(route, host, path):
            best = route
    return best


def match_reasons(route: RouteLike, host_header: str, path: str) -> list[str]:
    """Why `route` matches the request, in words (the route tester's "why"); assumes it does."""
    host = normalize_host(host_header)
    pattern = next((p for p in route.hosts if host_matches(p, host)), None)
    if pattern is None:
        reasons = ["the route names no hosts, so it applies to any host"]
    elif pattern.startswith("*."):
        reasons = [f"host {host} is below the wildcard {pattern}"]
    else:
        reasons = [f"host {host} is the route's host {pattern}"]
    base = prefix_base(route.path)
    if route.path_match == "exact":
        reasons.append(f"path {path} is exactly {route.path}")
    elif not base:
        reasons.append("the prefix / matches every path")
    elif path == base:
        reasons.append(f"path {path} is the prefix {base} itself")
    else:
        reasons.append(f"path {path} is below the prefix {base}/")
    return reasons


def _host_pattern_covers(better: str, worse: str) -> bool:
    """Every host `worse` (a name or `*.domain`) matches, `better` matches too."""
    if not better.startswith("*."):
        return worse == better
    return (worse[1:] if worse.startswith("*.") else worse).endswith(better[1:])


def _path_covers(better: RouteLike, worse: RouteLike) -> bool:
    if better.path_match == "exact":
        return worse.path_match == "exact" and worse.path == better.path
    if worse.path_match == "exact":
        return path_matches(better, worse.path)
    base, inner = prefix_base(better.path), prefix_base(worse.path)
    return not base or inner == base or inner.startswith(base + "/")


def shadowing_routes(routes: Iterable[R], candidate: RouteLike) -> list[R]:
    """The better-ranked routes that together match every request `candidate` matches, or [] when
    `candidate` serves at least one request.

    Complete, not a heuristic: a route's requests are the product of its host patterns and its path
    set. A prefix's path set is infinite below it and an exact host or a single path is one point,
    so no union of routes covers one host pattern x path set unless a single route does; checking
    each host pattern of the candidate against single routes therefore decides the question.
    """
    rank = route_rank(candidate)
    better = sorted((r for r in routes if r.id != candidate.id and route_rank(r) < rank
                     and _path_covers(r, candidate)), key=route_rank)
    found: list[R] = []
    for pattern in candidate.hosts or [None]:
        cover = next((r for r in better if (not r.hosts if pattern is None else
                                            any(_host_pattern_covers(b, pattern) for b in r.hosts))), None)
        if cover is None:
            return []
        if cover not in found:
            found.append(cover)
    return found


def newly_shadowed(routes: Iterable[R], candidate: R) -> list[R]:
    """Routes that serve some request today and none once `candidate` is added (or replaces the route
    with its id). Only routes `candidate` ranks before and whose paths it covers can be affected."""
    before = [r for r in routes if r.id != candidate.id]
    after = [*before, candidate]
    rank = route_rank(candidate)
    affected = [r for r in before if route_rank(r) > rank and _path_covers(candidate, r)]
    return [r for r in affected if shadowing_routes(after, r) and not shadowing_routes(before, r)]


def priority_base(path: str, path_match: str) -> int:
    """Where default_priority starts looking: the path's band."""
    length = len(prefix_base(path) if path_match == "prefix" else path)
    return 40_000 - 20 * min(length, 1_000) - (10 if path_match == "exact" else 0)


def default_priority(path: str, path_match: str, taken: set[int]) -> int:
    """A free priority that puts longer paths first and, for the same path, exact before prefix.

    Bands of 10 numbers per path length (exact just before prefix); a full band spills to the next
    free number after it, so the order holds for the first ten routes of each length; with every number from the
    band up taken, the first free one below it.
    """
    base = priority_base(path, path_match)
    # Lazily: a tuple of every number it might try (50,000) cost every route create ~1.5 ms under its LB's lock.
    for priority in chain(range(base, MAX_PRIORITY + 1), range(base - 1, 0, -1)):
        if priority not in taken:
            return priority
    raise ValueError("no free priority")
