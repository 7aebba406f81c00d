"""What a route write is checked against: its own fields and targets, the hostnames its org holds, and the LB's
other routes (the same host, path and match; the org's priorities; reachability). Reads only: route_save
(apps.balancers.services) runs them, the ones that read other routes under the LB's lock."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from django.db import connection
from django.db.models import BooleanField, F, Func, Q, QuerySet, Value

from apps.accounts.principal import Principal
from apps.balancers import hostnames, routing
from apps.balancers.models import HostnameClaim, LoadBalancer, Route, RouteChange
from apps.core.errors import Conflict, DoesNotExist, DomainError
from apps.core.prepared import PreparedQuery

NEW_ROUTE_ID = 2**62  # a route not saved yet gets the next id, so it ranks after every equal one


def check_route(*, route: Route, targets: list[dict[str, Any]]) -> None:
    if route.redirect_url and targets:
        raise DomainError("invalid_route", "A route either redirects or forwards to pools, not both.", field="targets")
    if not route.redirect_url and not targets:
        raise DomainError("invalid_route", "A route needs at least one target pool or a redirect URL.",
                          field="targets")
    if targets and sum(t["weight"] for t in targets) <= 0:
        raise DomainError("invalid_weights", "Target weights must add up to more than zero.", field="targets")
    pool_ids = [t["pool"].pk for t in targets]
    if len(set(pool_ids)) != len(pool_ids):
        raise DomainError("duplicate_target", "Each pool may appear once among a route's targets.", field="targets")
    for target in targets:
        pool = target["pool"]
        if pool.lb_id != route.lb_id:
            raise DomainError("pool_not_on_lb", f"Pool '{pool.name}' belongs to another load balancer.",
                              field="targets")
        if not route.org.is_operator and pool.org_id != route.org_id:
            raise DoesNotExist("Target pool not found.", field="targets")
    if route.lb.shared and not route.hosts and not route.org.is_operator:
        raise DomainError("hosts_required", "Routes on a shared load balancer must name their hostnames.",
                          field="hosts")
    _check_hosts_owned(org=route.org, hosts=route.hosts)


PeerRows = list[tuple[routing.RouteRow, bool, bool, bool]]
Concerns = Callable[[int, int, list[str], str], bool]


def _peer_rows(route: Route) -> tuple[PeerRows, Concerns]:
    """The LB's other routes a write is checked against: (row, same path and match: a sibling, same org and
    priority, may cover the route or be covered by it); and whether another route (org, priority, hosts, path) could
    be among them, so a read made before the LB's lock can be kept under it (early_peers).

    Only routes that can overlap are reachability peers: host routes of the same org (hostnames are owned, so
    other tenants' host routes never match the same request) or any-host routes (which rank after every host
    route, apps.balancers.routing); of those only the routes on the same path line can cover it or be covered by
    it (loading every route of the scope cost ~20 ms a write at 20k any-host routes); and of a host route's, on
    PostgreSQL, only those whose hosts relate to its own (routing.related_hosts), then those that may cover the
    other hosts of the routes it could leave never serving (routing.hosts_behind): a tenant's thousand hostnames on
    one LB each cost every write of the tenant there a row otherwise. A sibling shares a host (or has none, as
    the route), so it is among them too. SQLite (`make run`'s demo) has no JSON array test: there every host
    route of the path line is loaded.
    """
    ancestors, base = routing.related_bases(route.path)
    by_hosts = bool(route.hosts) and connection.vendor == "postgresql"
    line = Q(org_id=route.org_id) & ~Q(hosts=[]) if route.hosts else Q(hosts=[])
    # One LB's rows: the model's ordering (LB name, priority) would join the LB table to sort by a constant.
    rows = Route.objects.filter(lb_id=route.lb_id).exclude(pk=route.pk).order_by("priority", "pk")
    if base is not None:
        rows = rows.annotate(base=Func(F("path"), Value("/"), function="rtrim"))
        line &= Q(base__in=ancestors) | Q(base__startswith=base + "/")
    peer, sibling = line, Q(path=route.path)
    covering, below = routing.related_hosts(route.hosts) if by_hosts else ([], [])
    if by_hosts:
        peer &= _holding(covering, below)
        sibling &= Q(hosts__has_any_keys=list(route.hosts))
    elif not route.hosts:
        sibling &= Q(hosts=[])
    scope = sibling | peer
    if route.priority is not None:  # a route without one yet takes a free one (route_save): none taken to look for
        scope |= Q(org_id=route.org_id, priority=route.priority)
    # Which rule each row concerns is decided here, as the filter does (rtrim, prefix): one condition to compile
    # instead of three more, on the path of every route write, twice.
    related, held = set(ancestors), set(covering)

    def is_peer(org_id: int, hosts: list[str], path: str) -> bool:
        if (org_id != route.org_id or not hosts) if route.hosts else hosts:
            return False
        if by_hosts and not routing.host_related(hosts, held, below):
            return False  # a sibling or a priority holder loaded for its own rule
        stem = path.rstrip("/")
        return base is None or stem in related or stem.startswith(base + "/")

    def read(found: QuerySet, peers: bool = False) -> list[tuple[routing.RouteRow, bool, bool, bool]]:
        """`peers`: every row found is one (the second look: host routes of the line, by the hosts they hold)."""
        return [(routing.RouteRow(id=pk, priority=priority, hosts=tuple(hosts), path_match=match, path=path),
                 path == route.path and match == route.path_match,
                 org_id == route.org_id and priority == route.priority,
                 peers or is_peer(org_id, hosts, path))
                for pk, org_id, priority, hosts, match, path in found
                .values_list("id", "org_id", "priority", "hosts", "path_match", "path")]

    loaded = read(rows.filter(scope))
    behind: set[str] = set()
    if by_hosts and route.priority is not None:
        behind = set(routing.hosts_behind([row for row, _, _, peer in loaded if peer], _as_row(route)))
        if behind:
            seen = [row.id for row, *_ in loaded]
            loaded += read(rows.filter(line, hosts__has_any_keys=sorted(behind)).exclude(pk__in=seen), peers=True)

    def concerns(org_id: int, priority: int, hosts: list[str], path: str) -> bool:
        """A superset of what the two looks above load: the same path whatever its hosts, the org's priority, a
        peer, or a host route of the org holding one of the hosts of the second look."""
        return (path == route.path or (org_id == route.org_id and priority == route.priority)
                or is_peer(org_id, hosts, path) or (org_id == route.org_id and not behind.isdisjoint(hosts)))

    return loaded, concerns


@dataclass(frozen=True)
class PeerRead:
    """The routes a write is checked against, read before the LB's lock, and the LB revision they are at least as
    new as (read first: a route written between the two reads is named by the journal too)."""

    revision: int
    rows: PeerRows
    concerns: Concerns


_LB_REVISION = PreparedQuery(lambda lb_id: LoadBalancer.objects.filter(pk=lb_id).values_list("revision", flat=True),
                             {"lb_id": (1, 2)})
# The routes written since a revision, as the journal names them (lb_touch writes one row per route per bump) and
# as they are now: a deleted one has no row. The revision of each, so a bump the journal does not name shows.
_WRITTEN_SINCE = (
    "SELECT c.lb_revision, c.route_id, r.org_id, r.priority, r.hosts, r.path "  # noqa: S608
    f"FROM {RouteChange._meta.db_table} c LEFT JOIN {Route._meta.db_table} r "
    "ON r.id = c.route_id AND r.lb_id = c.lb_id WHERE c.lb_id = %s AND c.lb_revision > %s AND c.lb_revision <= %s")


def early_peers(route: Route) -> PeerRead | None:
    """The peer read of a write, made before the LB's lock so its holder does not wait on it: the LB's writes are
    ordered by that lock, and the peer read was ~40% of the Python its holder ran (py-spy, bench-scale's sustained
    phase). None where the read must wait for the lock: a route taking a free priority (chosen under it), SQLite."""
    if route.priority is None or connection.vendor != "postgresql":
        return None
    revision = _LB_REVISION.first(lb_id=route.lb_id)
    if revision is None:
        return None
    rows, concerns = _peer_rows(route)
    return PeerRead(revision, rows, concerns)


def _still_current(route: Route, early: PeerRead, revision: int | None) -> PeerRows | None:
    """`early`'s rows when no route written since it (under the lock, at `revision`) concerns this write; None when
    one may, or when a bump since names no route (a change the journal does not describe): then the read is made
    again under the lock."""
    if revision == early.revision:
        return early.rows
    if revision is None or revision < early.revision:
        return None
    with connection.cursor() as cursor:
        cursor.execute(_WRITTEN_SINCE, [route.lb_id, early.revision, revision])
        written = cursor.fetchall()
    read = {row.id for row, *_ in early.rows}
    for _, route_id, org_id, priority, hosts, path in written:
        if route_id == route.pk:
            continue  # itself: never its own peer
        if isinstance(hosts, str):  # Django has psycopg hand jsonb over as text (its JSONField decodes it)
            hosts = json.loads(hosts)
        if route_id in read or (org_id is not None and early.concerns(org_id, priority, hosts, path)):
            return None
    return early.rows if len({r for r, *_ in written}) == revision - early.revision else None


def _holding(covering: list[str], below: list[str]) -> Q:
    """Routes whose hosts hold one of `covering`, or a pattern under one of the `below` domains (PostgreSQL)."""
    held = Q(hosts__has_any_keys=covering)
    for domain in below:
        held |= Q(_HostUnder(domain))
    return held


class _HostUnder(Func):
    """A route's hosts JSON array holds a name under `domain` (PostgreSQL). Hostnames are validated (letters,
    digits, '-', '.', a leading '*.'), so LIKE has nothing to escape; the column is compiled, so the test holds
    wherever the query puts the table (a subquery's alias)."""

    output_field = BooleanField()

    def __init__(self, domain: str) -> None:
        super().__init__(F("hosts"), Value(f"%.{domain}"))

    def as_sql(self, compiler, connection, **extra):  # type: ignore[no-untyped-def]
        hosts, pattern = (compiler.compile(e) for e in self.get_source_expressions())
        sql = f"EXISTS (SELECT 1 FROM jsonb_array_elements_text({hosts[0]}) AS h(v) WHERE h.v LIKE {pattern[0]})"  # noqa: S608
        return sql, (*hosts[1], *pattern[1])


def _as_row(route: Route) -> routing.RouteRow:
    return routing.RouteRow(id=route.pk or NEW_ROUTE_ID, priority=route.priority, hosts=tuple(route.hosts),
                            path_match=route.path_match, path=route.path)


def _check_route_siblings(route: Route, siblings: list[routing.RouteRow]) -> None:
    """No other route of the LB matches the same host, path and match."""
    wanted = {hostnames.normalize(h) for h in route.hosts}
    for other in siblings:
        other_hosts = {hostnames.normalize(h) for h in other.hosts}
        if (not wanted and not other_hosts) or wanted & other_hosts:
            raise Conflict("route_conflict",
                           "Another route on this load balancer already matches the same host, path and match.",
                           field="path")


def _describe(principal: Principal, row: routing.RouteRow) -> str:
    """A route named for the caller, or "another tenant's route" when the caller may not see it."""
    if not Route.objects.restrict(principal, "view").filter(pk=row.id).exists():
        return "another tenant's route"
    return (f"route {row.id} (priority {row.priority}, {', '.join(row.hosts) or 'any host'}, "
            f"{row.path_match} {row.path})")


def _check_reachable(*, principal: Principal, route: Route, peers: list[routing.RouteRow]) -> None:
    """Refuse a route that could never serve a request, and one that would leave another never serving
    (`peers`: the routes that can overlap it, _peer_rows)."""
    candidate = _as_row(route)
    shadows = routing.shadowing_routes(peers, candidate)
    if shadows:
        names = "; ".join(_describe(principal, row) for row in shadows)
        raise DomainError("route_shadowed",
                          f"This route would never serve a request: {names} matches every request it covers "
                          "first. Give it a better (lower) priority or a narrower host or path.",
                          field="priority", status=422)
    for victim in routing.newly_shadowed(peers, candidate):
        raise DomainError("route_shadows",
                          f"This route would leave {_describe(principal, victim)} never serving a request "
                          "(it would match every request that route covers first). Give it a worse (higher) "
                          "priority or a narrower host or path.", field="priority", status=422)


def check_peers(principal: Principal, route: Route, early: PeerRead | None = None, revision: int | None = None) -> None:
    """The rules that read the LB's other routes: same host, path and match; the org's priority; reachability.
    Under the LB's lock, at its `revision`; `early`: the routes read before it, kept if nothing since concerns them."""
    rows = _still_current(route, early, revision) if early is not None else None
    if rows is None:
        rows, _ = _peer_rows(route)
    _check_route_siblings(route, [row for row, sibling, _, _ in rows if sibling])
    # Priorities are per organization: another tenant's numbers are neither taken nor revealed.
    if any(taken for _, _, taken, _ in rows):
        raise Conflict("priority_taken",
                       f"Priority {route.priority} is already used by another of your routes on this load "
                       "balancer.", field="priority")
    _check_reachable(principal=principal, route=route, peers=[row for row, _, _, peer in rows if peer])


def claims_related(hosts: Iterable[str]) -> QuerySet[HostnameClaim]:
    """The claims that may cover or overlap any of `hosts` (hostnames.related): a few indexed rows where
    reading every claim cost each route write time in proportion to all tenants' hostnames."""
    near = Q(pk__in=[])
    for host in hosts:
        names, under = hostnames.related(host)
        near |= Q(hostname__in=sorted(names))
        if under is not None:
            near |= Q(hostname__endswith=under)
    return HostnameClaim.objects.filter(near)


def _check_hosts_owned(*, org, hosts: Iterable[str]) -> None:
    hosts = list(hosts)
    claims = list(claims_related(hosts).exclude(status=HostnameClaim.Status.REJECTED)
                  .values_list("org_id", "hostname", "status")) if hosts else []
    for host in hosts:
        own = any(org_id == org.pk and status == HostnameClaim.Status.APPROVED and hostnames.covers(name, host)
                  for org_id, name, status in claims)
        if own:
            continue
        foreign = any(org_id != org.pk and status == HostnameClaim.Status.APPROVED and hostnames.overlaps(name, host)
                      for org_id, name, status in claims)
        if org.is_operator and not foreign:
            continue  # operators route unclaimed hostnames freely, never a tenant's
        raise DomainError("hostname_not_claimed",
                          f"'{host}' is not covered by an approved hostname claim of your organization.",
                          field="hosts")
