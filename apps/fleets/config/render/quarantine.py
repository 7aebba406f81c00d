"""Keep one tenant's broken object from blocking everybody's deploys: render what is valid.

A fleet's snapshot mixes the objects of many tenants. `check_snapshot` refuses the whole snapshot on
the first bad value, which was right for a single owner and wrong for a shared fleet: a route of one
customer aimed at a pool that left its LB froze every later revision of every tenant.

`quarantine` takes the objects out one by one, at the finest grain that keeps the rest meaningful:

- a pool that fails its checks is left out, and so is every route target aiming at it;
- a route that fails its checks (bad value, a target pool not in the snapshot) is left out;
- a listener that fails its own checks (an https listener without certificate, a default pool that
  is not in the snapshot) is left out, with its routes;
- of two listeners that would bind the same address and port, or carry two different certificates
  under one name, the older (lower id) stays.

What remains passes `check_snapshot` by construction. Each removal is a `Problem` naming the kind and
id of the object left out, so the caller can tell the object's owner, and only its owner.
Pure: plain dataclasses in, plain dataclasses out.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from apps.fleets.config.render.guard import UnsafeValue, check_listener, check_pool, check_route
from apps.fleets.config.spec import ANY_ADDRESS, FleetSnapshot, ListenerSpec


@dataclass(frozen=True)
class Problem:
    kind: str  # "pool" | "route" | "listener"
    id: int
    code: str
    detail: str

    def as_json(self) -> dict[str, object]:
        return {"kind": self.kind, "id": self.id, "code": self.code, "detail": self.detail}


def quarantine(snapshot: FleetSnapshot, *, shared_bind: bool = False) -> tuple[FleetSnapshot, tuple[Problem, ...]]:
    """`shared_bind`: some node of the fleet binds every listener on one address (its bind_address), so two
    listeners on one port clash there whatever their static IPs."""
    problems: dict[tuple[str, int], Problem] = {}

    def leave_out(kind: str, obj_id: int, exc: UnsafeValue) -> None:
        problems.setdefault((kind, obj_id), Problem(kind, obj_id, exc.code, exc.message))

    pools = []
    for i, pool in enumerate(snapshot.pools):
        try:
            check_pool(f"pools[{i}]", pool)
        except UnsafeValue as exc:
            leave_out("pool", pool.id, exc)
        else:
            pools.append(pool)
    pool_ids = {p.id for p in pools}

    listeners: list[ListenerSpec] = []
    for i, ln in enumerate(sorted(snapshot.listeners, key=lambda x: x.id)):
        routes = []
        for j, route in enumerate(ln.routes):
            if ("route", route.id) in problems:
                continue
            try:
                check_route(f"listeners[{i}].routes[{j}]", route, pool_ids)
            except UnsafeValue as exc:
                leave_out("route", route.id, exc)
            else:
                routes.append(route)
        kept = replace(ln, routes=tuple(routes))
        try:
            check_listener(f"listeners[{i}]", kept, pool_ids)
            _check_clashes(kept, listeners, shared_bind)
        except UnsafeValue as exc:
            leave_out("listener", ln.id, exc)
        else:
            listeners.append(kept)

    kept_ids = {ln.id for ln in listeners}
    order = [ln for ln in snapshot.listeners if ln.id in kept_ids]  # the caller's order, for stable output
    by_id = {ln.id: ln for ln in listeners}
    clean = replace(snapshot, pools=tuple(pools), listeners=tuple(by_id[ln.id] for ln in order))
    return clean, tuple(problems.values())


def _check_clashes(ln: ListenerSpec, kept: list[ListenerSpec], shared_bind: bool) -> None:
    for other in kept:
        same_address = shared_bind or other.address == ln.address or ANY_ADDRESS in (other.address, ln.address)
        if other.port == ln.port and same_address:
            raise UnsafeValue(f"listener {ln.id}", "port_in_use",
                              f"port {ln.port} is already bound on this fleet by another listener.")
        if (ln.cert is not None and other.cert is not None and ln.cert.name == other.cert.name
                and ln.cert.pem != other.cert.pem):
            raise UnsafeValue(f"listener {ln.id}", "cert_name_clash",
                              f"another listener on this fleet carries a different certificate named {ln.cert.name!r}.")
        if (ln.lb, ln.name) == (other.lb, other.name):
            raise UnsafeValue(f"listener {ln.id}", "duplicate_listener", "listener lb/name pairs must be unique.")
