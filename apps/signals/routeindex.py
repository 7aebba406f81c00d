"""Which route a logged request matched, by the one routing rule (apps.balancers.routing). Pure.

The log carries the host and path the config matched on (txn.host, txn.path), so the collector answers
the same question the config did with the same rule, indexed by host so a request looks at the routes
that name its host (exact, then its parent wildcards) and, when none matches, the any-host routes; inside
each, by path (its own and its ancestors'), so a lookup costs the same at 100 routes and at 100,000. A
request's answer is cached: the same host and path come back far more often than routes change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from apps.balancers.routing import path_matches, prefix_base, related_bases, route_rank

CACHE_MAX = 20_000
CACHE_PATH_MAX = 256


@dataclass(frozen=True, slots=True)
class IndexedRoute:
    id: int
    priority: int
    hosts: tuple[str, ...]
    path_match: str
    path: str
    org_id: int


class _PathIndex:
    """Routes by the paths they can match: exact routes by their path, prefix routes by their base, so a path
    looks at its own entries and its ancestors' (a few dict lookups), not at every route of the host."""

    def __init__(self) -> None:
        self.exact: dict[str, list[IndexedRoute]] = {}
        self.prefix: dict[str, list[IndexedRoute]] = {}

    def add(self, route: IndexedRoute) -> None:
        if route.path_match == "exact":
            self.exact.setdefault(route.path, []).append(route)
        else:
            self.prefix.setdefault(prefix_base(route.path), []).append(route)

    def best(self, path: str) -> IndexedRoute | None:
        found = list(self.exact.get(path, ()))
        for base in related_bases(path)[0]:
            found += self.prefix.get(base, ())
        matching = [r for r in found if path_matches(r, path)]
        return min(matching, key=route_rank) if matching else None


class RouteIndex:
    def __init__(self, routes: Iterable[IndexedRoute]) -> None:
        self.by_host: dict[str, _PathIndex] = {}
        self.any_host = _PathIndex()
        for route in routes:
            if not route.hosts:
                self.any_host.add(route)
            for pattern in route.hosts:
                self.by_host.setdefault(pattern, _PathIndex()).add(route)
        self._cache: OrderedDict[tuple[str, str], IndexedRoute | None] = OrderedDict()

    def _patterns(self, host: str) -> Iterable[_PathIndex]:
        """The host's own routes, then its parent wildcards' (`*.example.com` for `a.b.example.com`)."""
        own = self.by_host.get(host)
        if own is not None:
            yield own
        labels = host.split(".")
        for i in range(1, len(labels) - 1):
            wildcard = self.by_host.get("*." + ".".join(labels[i:]))
            if wildcard is not None:
                yield wildcard

    def resolve(self, host: str, path: str) -> IndexedRoute | None:
        key = (host, path)
        try:
            found = self._cache[key]
            self._cache.move_to_end(key)
            return found
        except KeyError:
            pass
        named = [r for r in (index.best(path) for index in self._patterns(host)) if r is not None]
        found = min(named, key=route_rank) if named else self.any_host.best(path)
        if len(path) <= CACHE_PATH_MAX:  # a flood of long paths must not hold megabytes of keys
            self._cache[key] = found
            if len(self._cache) > CACHE_MAX:
                self._cache.popitem(last=False)
        return found
