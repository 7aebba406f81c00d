"""Names in the request log (node, frontend, backend, server) to ids, loaded from the database.

Reloaded every RELOAD_S; within CHANGE_CHECK_S of any LB change (LoadBalancer.revision moves with every
route, pool, member and listener change: one aggregate query tells); and, at most every MISS_RELOAD_S, when a
line names a listener or member it does not know. A new route matches nothing unknown (its requests resolve
to another route or none), so only the change check counts it under itself within seconds.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from django.db.models import Count, Sum

from apps.balancers.models import Listener, LoadBalancer, Member, Route
from apps.fleets import selectors as fleet_selectors
from apps.signals.aggregate import Dims, Resolved
from apps.signals.logline import Request
from apps.signals.routeindex import IndexedRoute, RouteIndex
from apps.traffic.observe import parse_backend

RELOAD_S = 30.0
MISS_RELOAD_S = 2.0
CHANGE_CHECK_S = 2.0


@dataclass
class _Listener:
    id: int
    dims: Dims
    routes: RouteIndex | None  # None: a TCP listener, or an LB without routes


class DatabaseDirectory:
    def __init__(self, clock=time.monotonic) -> None:
        self.clock = clock
        self.loaded_at = -1e9
        self.listeners: dict[str, _Listener] = {}
        self.members: dict[tuple[int, str, str], tuple[int, Dims]] = {}
        self.node_regions: dict[str, str] = {}
        self.version: tuple[int, int] | None = None
        self.checked_at = -1e9

    @staticmethod
    def _version() -> tuple[int, int]:
        found = LoadBalancer.objects.aggregate(n=Count("pk"), revisions=Sum("revision"))
        return found["n"], found["revisions"] or 0

    def load(self) -> None:
        version = self._version()
        routes_by_lb: dict[int, list[IndexedRoute]] = {}
        for row in Route.objects.values_list(
                "id", "lb_id", "priority", "hosts", "path_match", "path", "org_id"):
            rid, lb_id, priority, hosts, path_match, path, org_id = row
            routes_by_lb.setdefault(lb_id, []).append(
                IndexedRoute(rid, priority, tuple(hosts), path_match, path, org_id))
        listeners = {}
        for lid, name, lb_id, lb_name, org_id in Listener.objects.values_list(
                "id", "name", "lb_id", "lb__name", "lb__org_id"):
            routes = routes_by_lb.get(lb_id)
            listeners[fleet_selectors.listener_frontend(lb_name, name)] = _Listener(lid, Dims(org_id, lb_id),
                                                          RouteIndex(routes) if routes else None)
        members = {}
        for mid, pool_id, region, name, org_id, lb_id in Member.objects.values_list(
                "id", "pool_id", "region__slug", "name", "pool__org_id", "pool__lb_id"):
            members[(pool_id, region, name)] = (mid, Dims(org_id, lb_id, pool_id, region))
        self.listeners, self.members = listeners, members
        self.node_regions = fleet_selectors.node_regions()
        self.version, self.loaded_at = version, self.clock()
        self.checked_at = self.loaded_at

    def maybe_reload(self, missed: bool = False) -> None:
        """Called for every unknown name (missed) and once a second by the collector."""
        now = self.clock()
        age = now - self.loaded_at
        if age >= RELOAD_S or (missed and age >= MISS_RELOAD_S):
            self.load()
        elif now - self.checked_at >= CHANGE_CHECK_S:
            self.checked_at = now
            if self._version() != self.version:
                self.load()

    def _lookup(self, request: Request) -> tuple[_Listener | None, tuple[int, Dims] | None, bool]:
        """(listener, member, everything named was known)."""
        listener = self.listeners.get(request.frontend)
        if request.server is None:
            return listener, None, listener is not None
        ref = parse_backend(request.backend)
        member = self.members.get((ref.pool_id, ref.region, request.server)) if ref is not None else None
        return listener, member, listener is not None and member is not None

    def resolve(self, request: Request) -> Resolved:
        if request.node not in self.node_regions:
            # Not a node Spillway runs (anyone who reaches the port can send a line): counted nowhere, or it
            # could fake a node's figures (and trip or hide a canary). A node added since: reloaded below.
            self.maybe_reload(missed=True)
            if request.node not in self.node_regions:
                return Resolved(None, None, None)
        listener, member, known = self._lookup(request)
        if not known:
            self.maybe_reload(missed=True)
            listener, member, _ = self._lookup(request)
        if listener is None:
            return Resolved(None, None, None)
        route = None
        if listener.routes is not None and request.path != "-":
            found = listener.routes.resolve(request.host, request.path)
            if found is not None:
                route = (found.id, Dims(found.org_id, listener.dims.lb_id))
        # A listener's series is per node: its region is where the request arrived.
        region = self.node_regions.get(request.node, "")
        return Resolved((listener.id, Dims(listener.dims.org_id, listener.dims.lb_id, None, region)), route, member)
