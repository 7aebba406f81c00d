"""The renderer's second line of defence: every value from a snapshot is re-checked before use.

The API already validates input with the same rules (apps.core.validators); this module exists so that
a bug or a bypass upstream (a migration, an admin shell, a new endpoint) still cannot put a newline or
a brace into haproxy.cfg. It returns cleaned copies (canonical IPs, lower-case hosts) so the renderer
only ever formats values that went through here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable
from dataclasses import replace
from typing import TypeVar

from apps.core import netpolicy
from apps.core import validators as v
from apps.fleets import caches
from apps.fleets.config.render.memo import by_identity
from apps.fleets.config.spec import (
    CertSpec,
    FleetSnapshot,
    HealthCheckSpec,
    ListenerSpec,
    MemberSpec,
    NodeSpec,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
    RouteSpec,
    RouteTargetSpec,
)

T = TypeVar("T")

# Unix socket paths are limited to 107 bytes; the longest name in runtime_dir is "/master.sock".
MAX_RUNTIME_DIR_LEN = 95
_RUNTIME_DIR_RE = re.compile(r"^(?:/[A-Za-z0-9._-]+)+$")
_PEM_RE = re.compile(rb"^-----BEGIN [A-Z0-9 ]+-----\r?\n[A-Za-z0-9+/=\r\n:,\- ]+-----END [A-Z0-9 ]+-----")
MAX_ID = 2**31 - 1
MAX_RATE_PER_NODE = 10**9
MAX_PRIORITY = 10**9


class UnsafeValue(v.InvalidValue):
    """A snapshot value failed its allowlist check; `field` says where (e.g. listeners[0].routes[2].path)."""

    def __init__(self, field: str, code: str, message: str) -> None:
        super().__init__(code, f"{field}: {message}")
        self.field = field


def _memoized(check: Callable[[object], T]) -> Callable[[object], T]:
    """Cache a pure validator's accepted strings: a 20k-route snapshot repeats most hosts, regions and
    member names many times. Rejections are not cached (they raise), so nothing unsafe is remembered."""
    cached = functools.lru_cache(maxsize=1 << 16)(check)

    def run(value: object) -> T:
        return cached(value) if type(value) is str else check(value)

    return run


_slug = _memoized(v.validate_slug)
_hostname = _memoized(v.validate_hostname)
_ip = _memoized(v.validate_ip)


def _checked(field: str, check: Callable[[object], T], value: object) -> T:
    try:
        return check(value)
    except v.InvalidValue as exc:
        raise UnsafeValue(field, exc.code, exc.message) from None


def _choice(field: str, value: object, allowed: tuple[str, ...]) -> str:
    if not isinstance(value, str) or value not in allowed:
        raise UnsafeValue(field, "invalid_choice", f"{value!r} is not one of {', '.join(allowed)}.")
    return value


def _int(field: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UnsafeValue(field, "invalid_integer", f"{value!r} is not an integer in {low}..{high}.")
    return value


def _runtime_dir(field: str, value: object) -> str:
    if not isinstance(value, str) or len(value) > MAX_RUNTIME_DIR_LEN or not _RUNTIME_DIR_RE.match(value):
        raise UnsafeValue(
            field,
            "invalid_runtime_dir",
            f"{value!r} must be an absolute path of letters, digits, '.', '_', '-' and '/', "
            f"at most {MAX_RUNTIME_DIR_LEN} characters, without a trailing slash.",
        )
    if "/../" in value + "/" or "/./" in value + "/":
        raise UnsafeValue(field, "invalid_runtime_dir", f"{value!r} must not contain '.' or '..' steps.")
    return value


def _items(field: str, value: object, kind: type[T]) -> list[tuple[str, T]]:
    """(field name, item) pairs of a tuple whose items must all be `kind`."""
    if not isinstance(value, tuple):
        raise UnsafeValue(field, "invalid_type", f"expected a tuple, got {type(value).__name__}.")
    for i, item in enumerate(value):
        if not isinstance(item, kind):
            raise UnsafeValue(f"{field}[{i}]", "invalid_type", f"expected {kind.__name__}, got {type(item).__name__}.")
    return [(f"{field}[{i}]", item) for i, item in enumerate(value)]


def check_node(node: NodeSpec) -> NodeSpec:
    return NodeSpec(
        name=_checked("node.name", _slug, node.name),
        runtime_dir=_runtime_dir("node.runtime_dir", node.runtime_dir),
        bind_address=(None if node.bind_address is None else _checked("node.bind_address", _ip, node.bind_address)),
        vrrp=node.vrrp,  # checked by render.keepalived.check_vrrp, the one place that formats it
        health=None if node.health is None else (_checked("node.health.address", _ip, node.health[0]),
                                                 _checked("node.health.port", v.validate_port, node.health[1])),
        drained=bool(node.drained),
        signals=None if node.signals is None else (_checked("node.signals.address", _ip, node.signals[0]),
                                                   _checked("node.signals.port", v.validate_port, node.signals[1])),
        signals_tag=_checked("node.signals_tag", _signals_tag, node.signals_tag) if node.signals else "",
    )


def _signals_tag(value: object) -> str:
    """`<fleet>/<node>`: two slugs, written into the node's global section (`set-var proc.node str(...)`)."""
    fleet, _, node = str(value).partition("/")
    return f"{_slug(fleet)}/{_slug(node)}"


def _member_ip(value: object) -> str:
    address = _ip(value)
    ip = netpolicy.parse_ip(address)
    kind = netpolicy.address_class(ip) if ip is not None else None
    if kind in netpolicy.NEVER_A_MEMBER:
        raise v.InvalidValue("member_forbidden_address", f"{address} is a {kind} address, never a member.")
    return address


def _check_member(field: str, member: MemberSpec) -> MemberSpec:
    return MemberSpec(
        name=_checked(f"{field}.name", _slug, member.name),
        address=_checked(f"{field}.address", _member_ip, member.address),
        port=_checked(f"{field}.port", v.validate_port, member.port),
        weight=_checked(f"{field}.weight", v.validate_weight, member.weight),
        admin_state=_choice(f"{field}.admin_state", member.admin_state, ("active", "drain", "maint")),  # type: ignore[arg-type]
        id=_int(f"{field}.id", member.id, 0, 2**63 - 1),
    )


def _check_health(field: str, health: HealthCheckSpec) -> HealthCheckSpec:
    return HealthCheckSpec(
        path=_checked(f"{field}.path", v.validate_path, health.path),
        interval_s=_int(f"{field}.interval_s", health.interval_s, 1, 3600),
        rise=_int(f"{field}.rise", health.rise, 1, 100),
        fall=_int(f"{field}.fall", health.fall, 1, 100),
        expected_status=_int(f"{field}.expected_status", health.expected_status, 100, 599),
    )


def check_pool(field: str, pool: PoolSpec) -> PoolSpec:
    regions = []
    for rfield, region in _items(f"{field}.regions", pool.regions, PoolRegionSpec):
        members = tuple(_check_member(mf, m) for mf, m in _items(f"{rfield}.members", region.members, MemberSpec))
        names = [m.name for m in members]
        if len(set(names)) != len(names):
            raise UnsafeValue(f"{rfield}.members", "duplicate_member", "member names must be unique.")
        regions.append(PoolRegionSpec(region=_checked(f"{rfield}.region", _slug, region.region), members=members))
    if len({r.region for r in regions}) != len(regions):
        raise UnsafeValue(f"{field}.regions", "duplicate_region", "each region may appear once per pool.")
    chain = []
    for sfield, step in _items(f"{field}.chain", pool.chain, RegionStep):
        region = _checked(f"{sfield}.region", _slug, step.region)
        if region not in {r.region for r in regions}:
            raise UnsafeValue(f"{sfield}.region", "unknown_region", f"pool has no members list for {region!r}.")
        limit = step.rate_limit_per_node
        chain.append(
            RegionStep(
                region=region,
                rate_limit_per_node=None
                if limit is None
                else _int(f"{sfield}.rate_limit_per_node", limit, 0, MAX_RATE_PER_NODE),
            )
        )
    return PoolSpec(
        id=_int(f"{field}.id", pool.id, 0, MAX_ID),
        name=_checked(f"{field}.name", _slug, pool.name),
        algorithm=_choice(f"{field}.algorithm", pool.algorithm, ("roundrobin", "leastconn", "source")),  # type: ignore[arg-type]
        health=None if pool.health is None else _check_health(f"{field}.health", pool.health),
        regions=tuple(regions),
        chain=tuple(chain),
        overload=_choice(f"{field}.overload", pool.overload, ("absorb", "shed")),  # type: ignore[arg-type]
        capacities=tuple(
            (
                _checked(f"{field}.capacities.region", _slug, region),
                None if cap is None else _int(f"{field}.capacities.{region}", cap, 0, MAX_RATE_PER_NODE),
            )
            for region, cap in pool.capacities
        ),
        sticky=pool.sticky is True,
    )


# Routes that passed check_route, by value: a route change re-renders 100k routes of which 99,999 are equal
# to ones checked the revision before, and quarantine and the renderer each check every route (~12 us each).
# The checked copy is what is returned, so a hit renders only values that passed the allowlist; only
# the pool references depend on the snapshot and are checked on every call.
_CHECKED_ROUTES: dict[RouteSpec, RouteSpec] = caches.register("checked_routes", {})
_CHECKED_ROUTES_MAX = 500_000


def check_route(field: str, route: RouteSpec, pool_ids: set[int]) -> RouteSpec:
    try:
        checked = _CHECKED_ROUTES.get(route)
    except TypeError:  # an unhashable field (a list where a tuple belongs): the full check names it
        checked = None
    if checked is None:
        checked = _route_fast(route) or _check_route_values(field, route)
        if len(_CHECKED_ROUTES) >= _CHECKED_ROUTES_MAX:
            _CHECKED_ROUTES.clear()
        _CHECKED_ROUTES[route] = checked
    for i, target in enumerate(checked.targets):
        if target.pool_id not in pool_ids:
            raise UnsafeValue(f"{field}.targets[{i}].pool_id", "unknown_pool",
                              f"pool {target.pool_id} is not in the snapshot.")
    return checked


_path = _memoized(v.validate_path)
_PATH_MATCHES = ("prefix", "exact")


def _route_fast(route: RouteSpec) -> RouteSpec | None:
    """_check_route_values for the common shape (exact types, no redirect), without building a field
    name per value (27 us -> ~5 us per route cold, 100k routes per render). None when anything is off:
    the full check then runs and names the field, so this only ever accepts what that one accepts and
    returns the same value (the route itself when nothing is normalised)."""
    if type(route) is not RouteSpec or route.redirect_url is not None:
        return None
    hosts, targets, ident, priority = route.hosts, route.targets, route.id, route.priority
    if type(hosts) is not tuple or type(targets) is not tuple or not targets:
        return None
    if type(ident) is not int or not 0 <= ident <= MAX_ID:
        return None
    if type(priority) is not int or not -MAX_PRIORITY <= priority <= MAX_PRIORITY:
        return None
    if type(route.path_match) is not str or route.path_match not in _PATH_MATCHES:
        return None
    total = 0
    for target in targets:
        if type(target) is not RouteTargetSpec:
            return None
        pool_id, weight = target.pool_id, target.weight
        if type(pool_id) is not int or type(weight) is not int:
            return None
        if not 0 <= pool_id <= MAX_ID or not 0 <= weight <= 10**6:
            return None
        total += weight
    if total <= 0:
        return None
    try:
        for host in hosts:
            if type(host) is not str:
                return None
        checked_hosts = tuple(sorted({_hostname(h) for h in hosts}))
        if type(route.path) is not str or _path(route.path) != route.path:
            return None
    except v.InvalidValue:
        return None
    return route if checked_hosts == hosts else replace(route, hosts=checked_hosts)


def _check_route_values(field: str, route: RouteSpec) -> RouteSpec:
    hosts = tuple(_checked(hf, _hostname, h) for hf, h in _items(f"{field}.hosts", route.hosts, str))
    redirect = route.redirect_url
    targets: list[RouteTargetSpec] = []
    for tfield, target in _items(f"{field}.targets", route.targets, RouteTargetSpec):
        pool_id = _int(f"{tfield}.pool_id", target.pool_id, 0, MAX_ID)
        targets.append(RouteTargetSpec(pool_id=pool_id, weight=_int(f"{tfield}.weight", target.weight, 0, 10**6)))
    if redirect is None and sum(t.weight for t in targets) <= 0:
        raise UnsafeValue(f"{field}.targets", "no_target", "a route needs a redirect or targets with weight > 0.")
    return RouteSpec(
        id=_int(f"{field}.id", route.id, 0, MAX_ID),
        priority=_int(f"{field}.priority", route.priority, -MAX_PRIORITY, MAX_PRIORITY),
        hosts=tuple(sorted(set(hosts))),
        path_match=_choice(f"{field}.path_match", route.path_match, ("prefix", "exact")),  # type: ignore[arg-type]
        path=_checked(f"{field}.path", v.validate_path, route.path),
        targets=tuple(targets),
        redirect_url=None if redirect is None else _checked(f"{field}.redirect_url", v.validate_redirect_url, redirect),
    )


def _check_cert(field: str, cert: CertSpec) -> CertSpec:
    name = _checked(f"{field}.name", _slug, cert.name)
    if not isinstance(cert.pem, bytes) or not _PEM_RE.match(cert.pem) or b"PRIVATE KEY-----" not in cert.pem:
        raise UnsafeValue(f"{field}.pem", "invalid_pem", "expected PEM text holding a certificate and its key.")
    return CertSpec(name=name, pem=cert.pem)


def check_listener(field: str, listener: ListenerSpec, pool_ids: set[int]) -> ListenerSpec:
    protocol = _choice(f"{field}.protocol", listener.protocol, ("http", "https", "tcp"))
    default_pool_id = listener.default_pool_id
    if default_pool_id is not None:
        _int(f"{field}.default_pool_id", default_pool_id, 0, MAX_ID)
        if default_pool_id not in pool_ids:
            raise UnsafeValue(
                f"{field}.default_pool_id", "unknown_pool", f"pool {default_pool_id} is not in the snapshot."
            )
    routes = tuple(check_route(rf, r, pool_ids) for rf, r in _items(f"{field}.routes", listener.routes, RouteSpec))
    if protocol == "tcp" and routes:
        raise UnsafeValue(f"{field}.routes", "routes_on_tcp", "TCP listeners route to their default pool only.")
    if len({r.id for r in routes}) != len(routes):
        raise UnsafeValue(f"{field}.routes", "duplicate_route", "route ids must be unique per listener.")
    cert = listener.cert
    if protocol == "https" and cert is None:
        raise UnsafeValue(f"{field}.cert", "missing_cert", "an https listener needs a certificate.")
    return replace(
        listener,
        id=_int(f"{field}.id", listener.id, 0, MAX_ID),
        lb=_checked(f"{field}.lb", _slug, listener.lb),
        name=_checked(f"{field}.name", _slug, listener.name),
        protocol=protocol,
        address=_checked(f"{field}.address", _ip, listener.address),
        port=_checked(f"{field}.port", v.validate_port, listener.port),
        routes=routes,
        cert=None if cert is None or protocol != "https" else _check_cert(f"{field}.cert", cert),
        no_route_status=_checked(f"{field}.no_route_status", v.validate_no_route_status, listener.no_route_status),
        no_route_body=_checked(f"{field}.no_route_body", v.validate_plain_message, listener.no_route_body),
    )


@by_identity  # every node of a rollout renders the same snapshot object (memo.py)
def check_snapshot(snapshot: FleetSnapshot) -> FleetSnapshot:
    """Validated, canonical copy of `snapshot`; raises UnsafeValue naming the first bad field."""
    pools = tuple(check_pool(pf, p) for pf, p in _items("pools", snapshot.pools, PoolSpec))
    pool_ids = {p.id for p in pools}
    if len(pool_ids) != len(pools):
        raise UnsafeValue("pools", "duplicate_pool", "pool ids must be unique.")
    listeners = tuple(
        check_listener(lf, ln, pool_ids) for lf, ln in _items("listeners", snapshot.listeners, ListenerSpec)
    )
    keys = [(ln.lb, ln.name) for ln in listeners]
    if len(set(keys)) != len(keys) or len({ln.id for ln in listeners}) != len(listeners):
        raise UnsafeValue("listeners", "duplicate_listener", "listener ids and lb/name pairs must be unique.")
    certs: dict[str, bytes] = {}
    for i, ln in enumerate(listeners):
        if ln.cert is not None and certs.setdefault(ln.cert.name, ln.cert.pem) != ln.cert.pem:
            raise UnsafeValue(
                f"listeners[{i}].cert.name",
                "cert_name_clash",
                f"two different certificates are both named {ln.cert.name!r}.",
            )
    return FleetSnapshot(
        fleet=_checked("fleet", _slug, snapshot.fleet),
        region=_checked("region", _slug, snapshot.region),
        revision=_int("revision", snapshot.revision, 0, 2**63 - 1),
        listeners=listeners,
        pools=pools,
    )
