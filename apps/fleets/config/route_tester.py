"""The route tester: which route, pool and region serve a request on a load balancer, and why.

Answered from the same rule the renderer lays out (apps.balancers.routing.resolve_route) over the
LB's saved routes, and from each fleet's latest rendered revision for the regions (its pools'
overflow chains as the nodes were given them). Read-only. A tenant sees another tenant's route only
as "another tenant's route": no id, hosts, pools or regions of it.
"""

from __future__ import annotations

import re
from typing import Any

from apps.accounts.principal import Principal
from apps.balancers import routing
from apps.balancers.models import Listener, LoadBalancer, Pool, Route
from apps.core.errors import DomainError
from apps.fleets import queries

_METHOD_RE = re.compile(r"^[A-Z]{1,16}$")


def _chains(lb: LoadBalancer, pool_ids: list[int], principal: Principal) -> list[dict[str, Any]]:
    """Per fleet serving the LB: each pool's region chain in the latest rendered revision."""
    out = []
    for fleet in queries.lb_fleets(lb).select_related("region").order_by("name"):
        revision = queries.latest_revision(fleet)
        # A route-lane revision stores only route changes: its pools are those of the full one it builds on.
        stored = queries.text_revision(revision).snapshot if revision else {}
        pools = {p["id"]: p for p in stored.get("pools", [])}
        entry: dict[str, Any] = {"region": fleet.region.slug, "rendered": revision is not None, "pools": []}
        if principal.is_operator:
            entry.update(fleet=fleet.name, revision=revision.number if revision else None)
        for pool_id in pool_ids:
            spec = pools.get(pool_id)
            if spec is None:
                continue
            chain = [{"region": region, "rate_limit_per_node": limit} for region, limit in spec["chain"]]
            if not chain:  # no capacity plan: every region unlimited, the fleet's own first (renderer default)
                regions = sorted((r["region"] for r in spec["regions"]), key=lambda r: (r != fleet.region.slug, r))
                chain = [{"region": r, "rate_limit_per_node": None} for r in regions]
            entry["pools"].append({"pool": pool_id, "serves_from": chain[0]["region"] if chain else None,
                                   "chain": chain})
        out.append(entry)
    return out


def route_test(*, lb: LoadBalancer, principal: Principal, host: str, path: str, method: str = "GET") -> dict[str, Any]:
    if not _METHOD_RE.match(method):
        raise DomainError("invalid_method", "Method is an HTTP method name such as GET or POST.", field="method")
    if not path.startswith("/"):
        raise DomainError("invalid_path", "Path starts with '/'.", field="path")
    path = path.split("?", 1)[0]  # routes never match the query
    rows = [routing.RouteRow(id=pk, priority=priority, hosts=tuple(hosts), path_match=match, path=rpath)
            for pk, priority, hosts, match, rpath in Route.objects.filter(lb=lb).values_list(
                "id", "priority", "hosts", "path_match", "path")]
    name = routing.normalize_host(host)
    matched = sorted((r for r in rows if routing.route_matches(r, name, path)), key=routing.route_rank)
    visible = set(Route.objects.restrict(principal, "view").filter(pk__in=[r.id for r in matched])
                  .values_list("pk", flat=True))
    winner = matched[0] if matched else None
    why: list[str] = [f"{method} routes like every other method: routes match host and path only"]
    result: dict[str, Any] = {"host": name, "path": path, "method": method, "route": None, "pools": [],
                              "also_matched": [r.id for r in matched[1:] if r.id in visible], "why": why,
                              "listeners": [], "regions": []}
    pool_ids: list[int] = []
    if winner is not None and winner.id not in visible:
        result["route"] = {"visible": False, "detail": "another tenant's route"}
        why.append("another tenant's route serves this host and path")
    elif winner is not None:
        route = Route.objects.prefetch_related("targets").get(pk=winner.id)
        result["route"] = {"visible": True, "id": route.pk, "priority": route.priority, "hosts": route.hosts,
                           "path_match": route.path_match, "path": route.path,
                           "redirect_url": route.redirect_url or None}
        why += routing.match_reasons(winner, host, path)
        if len(matched) > 1:
            why.append(f"it ranks first of {len(matched)} matching routes (routes naming hosts before any-host "
                       "routes, then the lowest priority, then the oldest)")
        targets = sorted(route.targets.all(), key=lambda t: t.pool_id)
        total = sum(t.weight for t in targets) or 1
        names = dict(Pool.objects.filter(pk__in=[t.pool_id for t in targets]).values_list("pk", "name"))
        result["pools"] = [{"id": t.pool_id, "name": names.get(t.pool_id),
                            "weight_percent": round(100 * t.weight / total, 1)} for t in targets if t.weight > 0]
        pool_ids = [p["id"] for p in result["pools"]]
    else:
        why.append("no route matches this host and path")
    for ln in Listener.objects.filter(lb=lb).exclude(protocol=Listener.Protocol.TCP).order_by("port"):
        answer: dict[str, Any] = {"id": ln.pk, "name": ln.name, "port": ln.port}
        if winner is not None:
            answer["outcome"] = "redirect" if result["route"].get("redirect_url") else "route"
        elif ln.default_pool_id is not None:
            answer["outcome"] = "default_pool"
            if Pool.objects.restrict(principal, "view").filter(pk=ln.default_pool_id).exists():
                answer["pool"] = ln.default_pool_id
                if ln.default_pool_id not in pool_ids:
                    pool_ids.append(ln.default_pool_id)
        else:
            answer.update(outcome="no_route", status=ln.no_route_status, body=ln.no_route_body)
        result["listeners"].append(answer)
    if result["route"] is None or result["route"]["visible"]:
        result["regions"] = _chains(lb, pool_ids, principal)
    return result
