"""Collects the render manifest while the renderer writes text (apps.fleets.config.spec.Manifest).

Consumers (node/apply.py's verification and hot-map detection, validation, the customer preview filter)
read these facts instead of parsing the text back. Kept cheap: owners are shared objects, one per
route, pool, host or routes-map action, and every line holds a reference to one of them.
"""

from __future__ import annotations

from collections.abc import Sequence

from apps.fleets.config.spec import Bind, Owner


class ManifestBuilder:
    def __init__(self) -> None:
        self.binds: list[Bind] = []
        self.frontends: list[str] = []
        self.backends: list[str] = []
        self.maps: dict[str, list[tuple[str, str]]] = {}
        # id(section lines) -> [(line index in the section, backend, server, admin state, weight)]
        self.server_lines: dict[int, list[tuple[int, str, str, str, int]]] = {}
        self.map_owners: dict[str, Sequence[Owner | None]] = {}
        self._pools: dict[int, Owner] = {}
        self._routes: dict[int, Owner] = {}

    def pool(self, pool_id: int) -> Owner:
        owner = self._pools.get(pool_id)
        if owner is None:
            owner = self._pools[pool_id] = Owner(pools=(pool_id,))
        return owner

    def route(self, route_id: int) -> Owner:
        owner = self._routes.get(route_id)
        if owner is None:
            owner = self._routes[route_id] = Owner(route=route_id)
        return owner

    def map_file(self, name: str, entries: list[tuple[str, str]], owners: Sequence[Owner | None]) -> bytes:
        """Record a map's entries and their owners (one each); returns the file's text (`key value` lines)."""
        self.maps[name] = entries
        self.map_owners[name] = owners
        return "".join(f"{key} {value}\n" for key, value in entries).encode()
