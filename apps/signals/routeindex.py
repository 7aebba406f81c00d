"""Which route a logged request matched, by the one routing rule (apps.balancers.routing). Pure.

The log carries the host and path the config matched on (txn.host, txn.path), so the collector answers
the same question the config did with the same rule, indexed by host so a request looks at the routes
that name its host (exact, then its parent wildcards) and, when none matches, the any-host routes. A
request's answer is cached: the same host and path come back far more often than routes change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

from apps.balancers.routing import path_matches, route_rank

CACHE_MAX = 20_000


@dataclass(frozen=True, slots=True)
class IndexedRoute:
    id: int
    priority: int
    hosts: tuple[str, ...]
    path_match: str
    path: str
    org_id: int


class RouteIndex:
    def __init__(self, routes: Iterable[IndexedRoute]) -> None:
        self.by_host: dict[str, list[IndexedRoute]] = {}
        self.any_host: list[IndexedRoute] = []
        for route in sorted(routes, key=route_rank):
            if not route.hosts:
                self.any_host.append(route)
            for pattern in route.hosts:
                self.by_host.setdefault(pattern, []).append(route)
        self._cache: OrderedDict[tuple[str, str], IndexedRoute | None] = OrderedDict()

    def _candidates(self, host: str) -> Iterable[IndexedRoute]:
        found = list(self.by_host.get(host, ()))
        labels = host.split(".")
        for i in range(1, len(labels) - 1):
            found += self.by_host.get("*." + ".".join(labels[i:]), ())
        return sorted(found, key=route_rank)

    def resolve(self, host: str, path: str) -> IndexedRoute | None:
        key = (host, path)
        try:
            found = self._cache[key]
            self._cache.move_to_end(key)
            return found
        except KeyError:
            pass
        found = next((r for r in self._candidates(host) if path_matches(r, path)), None)
        if found is None:
            found = next((r for r in self.any_host if path_matches(r, path)), None)
        self._cache[key] = found
        if len(self._cache) > CACHE_MAX:
            self._cache.popitem(last=False)
        return found
