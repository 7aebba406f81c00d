"""Frontend sections: bind lines, route classification (rules or maps), canary splits, overflow chains.

Every HTTP frontend works in three stages, so that the rule form and the map form differ only in stage 1:
1. classify: set `txn.rk` to the matched route's action key (`p<pool>`, `s<split>`, `u<route>`) or
   answer its redirect; nothing matched -> the default pool's key.
2. split: turn `s...` keys into one pool with `rand()`, and copy `p...` keys, into `txn.pool`.
3. overflow: per pool, walk its region chain with `use_backend` rules (health, then rate).
Stage 1 runs entirely in `http-request` rules, so a redirect route and a pool route are ordered by
priority between themselves (a `use_backend` rule could never win over an earlier redirect).

Per-request cost: stage 1 in map form is a few lookups whatever the route count, plus one integer comparison
per map bucket (MAP_BUCKETS); stage 3 reads the overflow chain from maps (render/chain.py). Neither depends on
how many routes or pools the listener has (`make bench-dataplane`).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from apps.fleets.config.digest import ACME_ANSWERS_FILE
from apps.fleets.config.render.chain import backend_name, chain_lines
from apps.fleets.config.render.manifest import ManifestBuilder
from apps.fleets.config.render.memo import by_identity
from apps.fleets.config.render.routing import (
    ANY_HOST_CLASS,
    action_key,
    build_route_maps,
    ordered_routes,
    parse_split_key,
    prefix_base,
    prepared_routes,
)
from apps.fleets.config.spec import Bind, ListenerSpec, Owner, PoolSpec, RoutesMapOwners, RouteSpec

INDENT = "    "


def frontend_name(listener: ListenerSpec) -> str:
    return listener_frontend(listener.lb, listener.name)


def listener_frontend(lb: str, listener: str) -> str:
    """The frontend of LB `lb`'s listener `listener` (what `show stat` and the request log call it)."""
    return f"fe_{lb}.{listener}"


def map_prefix(listener: ListenerSpec) -> str:
    # "." is not a slug character, so lb "a-b"/listener "c" and lb "a"/listener "b-c" stay distinct.
    return f"maps/{listener.lb}.{listener.name}"


# HTTP-01 challenges (RFC 8555 8.3): token -> key authorization, filled through the runtime API on
# every node while an ACME order is open (apps.acme). The file is always rendered empty and every HTTP
# frontend always carries the two lines below, so a challenge never changes a revision or needs a
# reload, and whichever node of whichever region the CA reaches answers it.
ACME_CHALLENGE_MAP = ACME_ANSWERS_FILE  # written on each node with the answers it serves (config/digest.py)
ACME_CHALLENGE_LINES = [
    "# ACME HTTP-01: answer /.well-known/acme-challenge/<token> from the challenge map (apps.acme).",
    f"http-request set-var(txn.acme) path,field(4,/),map({ACME_CHALLENGE_MAP}) "
    "if { path_beg /.well-known/acme-challenge/ }",
    'http-request return status 200 content-type text/plain lf-string "%[var(txn.acme)]" '
    "if { var(txn.acme) -m found }",
]


def format_address(address: str, port: int) -> str:
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


def log_format_literal(text: str) -> str:
    """`redirect location` takes a log-format string: a literal '%' must be written '%%'."""
    return text.replace("%", "%%")


@dataclass(frozen=True)
class ChainStep:
    backend: str
    rate_limit_per_node: int | None


def chain_rules(steps: list[ChainStep]) -> list[tuple[ChainStep, bool, bool]]:
    """(step, needs a usable server, needs spare rate) in evaluation order for one overflow chain.

    Pass 1 follows the chain: a step is used while it has a usable server and, when limited, while its
    per-backend session rate (= request rate in HTTP mode) is under this node's share. Pass 2: every
    region is over its share, so serve from the nearest healthy one rather than fail. Pass 3: nothing is
    healthy; the first region answers 503 itself, which is honest, instead of a wrong backend.
    """
    rules = [(step, True, step.rate_limit_per_node is not None) for step in steps]
    seen = {step.backend for step in steps if step.rate_limit_per_node is None}
    for step in steps:
        if step.backend not in seen:
            seen.add(step.backend)
            rules.append((step, True, False))
    if steps:
        rules.append((steps[0], False, False))
    return rules


def chain_rule_conditions(steps: list[ChainStep]) -> list[tuple[str, str]]:
    """chain_rules as (backend, inline condition text)."""
    out = []
    for step, up, spare in chain_rules(steps):
        conds = []
        if up:
            conds.append(f"{{ nbsrv({step.backend}) gt 0 }}")
        if spare:
            conds.append(f"{{ be_sess_rate({step.backend}) lt {step.rate_limit_per_node} }}")
        out.append((step.backend, " ".join(conds)))
    return out


def pool_steps(pool: PoolSpec, local_region: str, protocol: str) -> list[ChainStep]:
    """The pool's chain; without one, every region unlimited, the fleet's own region first."""
    if pool.chain:
        return [ChainStep(backend_name(pool.id, s.region, protocol), s.rate_limit_per_node) for s in pool.chain]
    regions = sorted((r.region for r in pool.regions), key=lambda r: (r != local_region, r))
    return [ChainStep(backend_name(pool.id, r, protocol), None) for r in regions]


FLOATING = "floating"  # bind_address value for nodes whose static IPs float between them (VRRP)


def _cond(*parts: str) -> str:
    return " ".join(p for p in parts if p)


def _bind_line(listener: ListenerSpec, bind_address: str | None, manifest: ManifestBuilder) -> str:
    """`bind_address` FLOATING: the listener's own address is a VIP keepalived moves between nodes."""
    floating = bind_address == FLOATING
    ip = listener.address if floating or not bind_address else bind_address
    address = format_address(ip, listener.port)
    # `transparent` (IP_TRANSPARENT, falling back to IP_FREEBIND; HAProxy 2.6 has no `freebind` keyword):
    # a backup node binds the VIP before it holds it, so it serves the moment keepalived moves the
    # address there, with no reload and no sysctl on the node.
    transparent = floating and listener.address not in ("0.0.0.0", "::")
    extra = " transparent" if transparent else ""
    manifest.binds.append(Bind(ip, listener.port, transparent))
    if listener.protocol == "https":
        assert listener.cert is not None
        # Relative to the config's own directory (`default-path config`, see sections.global_section).
        return f"bind {address}{extra} ssl crt certs/{listener.cert.name}.pem"
    return f"bind {address}{extra}"


def _host_acl_lines(route: RouteSpec) -> tuple[list[str], str]:
    if not route.hosts:
        return [], ""
    name = f"r{route.id}_host"
    exact = [h for h in route.hosts if not h.startswith("*.")]
    suffixes = [h[1:] for h in route.hosts if h.startswith("*.")]
    lines = []
    if exact:
        lines.append(f"acl {name} var(txn.host) -m str {' '.join(exact)}")
    if suffixes:
        lines.append(f"acl {name} var(txn.host) -m end {' '.join(suffixes)}")
    return lines, name


def _path_conds(route: RouteSpec) -> list[str]:
    """Alternatives (ORed) for the route's path: PathPrefix `/a` is `/a` itself or anything below `/a/`."""
    if route.path_match == "exact":
        return [f"{{ path {route.path} }}"]
    base = prefix_base(route.path)
    return [f"{{ path {base} }}", f"{{ path_beg {base}/ }}"] if base else [""]


def classify_with_rules(
    listener: ListenerSpec, ids: dict[str, str], manifest: ManifestBuilder, owners: list[Owner | None]
) -> list[str]:
    """One rule per route; appends each line's owner (its route) to `owners`."""
    lines = []
    for route in ordered_routes(listener.routes):
        acl_lines, acl = _host_acl_lines(route)
        lines.extend(acl_lines)
        owners += [manifest.route(route.id)] * (len(acl_lines) + 1)
        # AND binds tighter than || in HAProxy conditions: each alternative repeats the common part.
        cond = " || ".join(_cond("!{ var(txn.rk) -m found }", acl, alt) for alt in _path_conds(route))
        if route.redirect_url is not None:
            lines.append(
                f"http-request redirect location {log_format_literal(route.redirect_url)} code 302 "
                f"if {cond}  # route {route.id}"
            )
        else:
            key = action_key(route)
            lines.append(f"http-request set-var(txn.rk) str({ids.get(key, key)}) if {cond}  # route {route.id}")
    return lines


# The routes and redirects maps are split into this many files by a hash of each entry's host class (routes) or
# key (redirects), which HAProxy computes too (`crc32`, zlib's CRC-32, then `mod`): a route change rewrites,
# hashes and pushes one bucket's file instead of the whole map (at 100k routes a 5 MB routes map and a 1.5 MB
# redirects map per change and node). A lookup still reads one map: every key of a host class is in its class's
# bucket, and a request's class is known before the lookup. Each bucket costs a request one integer comparison.
MAP_BUCKETS = 16


def map_bucket(name: str) -> int:
    """The bucket of a host class or redirect key: `<name>,crc32,mod(MAP_BUCKETS)` in HAProxy."""
    return zlib.crc32(name.encode()) % MAP_BUCKETS


def routes_map_name(prefix: str, bucket: int) -> str:
    return f"{prefix}.routes.{bucket}.map"


def redirects_map_name(prefix: str, bucket: int) -> str:
    return f"{prefix}.redirects.{bucket}.map"


def routes_map_files(prefix: str) -> list[str]:
    return [routes_map_name(prefix, k) for k in range(MAP_BUCKETS)]


def split_runs(entries: list[tuple[str, str]], classes: list[str]) -> list[tuple[list[tuple[str, str]], list[str]]]:
    """(entries, their classes) per bucket, each in the map's order: a class's entries are one run."""
    buckets: list[tuple[list[tuple[str, str]], list[str]]] = [([], []) for _ in range(MAP_BUCKETS)]
    last, target = None, buckets[0]
    for entry, host_class in zip(entries, classes, strict=True):
        if host_class is not last:
            last, target = host_class, buckets[map_bucket(host_class)]
        target[0].append(entry)
        target[1].append(host_class)
    return buckets


def classify_with_maps(
    listener: ListenerSpec, files: dict[str, bytes], ids: dict[str, str], manifest: ManifestBuilder
) -> list[str]:
    """Map-based classification; adds the map files it references to `files` (and to the manifest).

    Every map and every lookup line is written even when a map is empty, so adding or removing a
    route changes only map contents, never haproxy.cfg: such a change is applied to a running node
    through the runtime API without a reload (node.hotchanges).
    """
    maps = build_route_maps(listener.routes)
    prefix = map_prefix(listener)
    lb = listener.lb
    hosts = {h: Owner(lb=lb, host=h) for h in maps.exact_hosts}
    hosts.update((p, Owner(lb=lb, host=p)) for _, p in maps.wildcards)
    files[f"{prefix}.hosts.map"] = manifest.map_file(
        f"{prefix}.hosts.map", [(h, h) for h in maps.exact_hosts], [hosts[h] for h in maps.exact_hosts])
    files[f"{prefix}.wildcards.map"] = manifest.map_file(
        f"{prefix}.wildcards.map", maps.wildcards, [hosts[p] for _, p in maps.wildcards])
    # A routes-map entry is owned by its host class and its action together (Owner's docstring).
    entries = [(key, ids.get(action, action)) for key, action in maps.entries]
    actions = {ids.get(action, action): _action_owner(lb, action, ids.get(action, action))
               for action in {action for _, action in maps.entries}}
    for bucket, (run, classes) in enumerate(split_runs(entries, maps.classes)):
        name = routes_map_name(prefix, bucket)
        files[name] = manifest.map_file(name, run, RoutesMapOwners(run, classes, actions))
    redirecting: list[list[RouteSpec]] = [[] for _ in range(MAP_BUCKETS)]
    for route in sorted((r for r in listener.routes if r.redirect_url is not None), key=lambda r: f"u{r.id}"):
        redirecting[map_bucket(f"u{route.id}")].append(route)
    for bucket, routes in enumerate(redirecting):
        name = redirects_map_name(prefix, bucket)
        files[name] = manifest.map_file(name, [(f"u{r.id}", r.redirect_url or "") for r in routes],
                                        [manifest.route(r.id) for r in routes])
    any_host = routes_map_name(prefix, map_bucket(ANY_HOST_CLASS))
    return [
        f"http-request set-var(txn.hc) var(txn.host),map_str({prefix}.hosts.map)",
        f"http-request set-var(txn.hc) var(txn.host),map_end({prefix}.wildcards.map) if !{{ var(txn.hc) -m found }}",
        f"http-request set-var(txn.hc) str({ANY_HOST_CLASS}) if !{{ var(txn.hc) -m found }}",
        f"http-request set-var(txn.hb) var(txn.hc),crc32,mod({MAP_BUCKETS})",
        *(f"http-request set-var(txn.rk) var(txn.hc),concat(,txn.path,?),map_beg({routes_map_name(prefix, k)}) "
          f"if {{ var(txn.hb) -m int {k} }}" for k in range(MAP_BUCKETS)),
        # No route of the host's own class matched: the any-host routes (routing.py).
        f"http-request set-var(txn.rk) str({ANY_HOST_CLASS}),concat(,txn.path,?),map_beg({any_host}) "
        "if !{ var(txn.rk) -m found }",
        f"http-request set-var(txn.ub) var(txn.rk),crc32,mod({MAP_BUCKETS}) if {{ var(txn.rk) -m beg u }}",
        *(f"http-request redirect location %[var(txn.rk),map_str({redirects_map_name(prefix, k)})] code 302 "
          f"if {{ var(txn.ub) -m int {k} }}" for k in range(MAP_BUCKETS)),
    ]


def _action_owner(lb: str, action: str, written: str) -> Owner:
    """A routes-map action's owner: the redirecting route (`u<id>`), or the pools it sends to."""
    if action.startswith("u"):
        return Owner(lb=lb, route=int(action[1:]), action=written)
    return Owner(lb=lb, pools=tuple(sorted({p for p, _ in parse_split_key(action)})), action=written)


def no_route_line(listener: ListenerSpec) -> str:
    """No route and no default pool: the listener's own small answer (404 by default), not HAProxy's 503."""
    # The body passed guard's allowlist (no quotes, backslashes, `$` or `%`), so it is literal here.
    return (f'http-request return status {listener.no_route_status} content-type text/plain '
            f'string "{listener.no_route_body}" if !{{ var(txn.rk) -m found }}')


@by_identity  # asked twice per render, and for every node of a rollout (memo.py)
def listener_action_keys(listener: ListenerSpec) -> list[str]:
    routes = listener.routes
    keys = {found[2] for r, found in zip(routes, prepared_routes(routes), strict=True) if r.redirect_url is None}
    if listener.default_pool_id is not None:
        keys.add(f"p{listener.default_pool_id}")
    return sorted(keys)


RAND_SCALE = 1_000_000  # one rand() per request; weights become ranges on this scale (error <= 1e-6)


def split_ids(keys: list[str]) -> dict[str, str]:
    """Content split key (`s1x9_2x1`) -> the short `s<n>` the config uses, numbered in sorted order.

    Numeric ids let the per-split rules compare an integer (`-m int`), which HAProxy does about 10x
    faster than a string (`-m str`), and every request passes every split's rules.
    """
    return {key: f"s{i}" for i, key in enumerate(k for k in keys if k.startswith("s"))}


def split_lines(
    keys: list[str], ids: dict[str, str], manifest: ManifestBuilder, owners: list[Owner | None]
) -> list[str]:
    """Stage 2; appends each line's owner to `owners` (a split's line: the pool it sends to)."""
    lines = []
    if ids:
        lines += [
            "http-request set-var(txn.split) var(txn.rk),field(2,s),add(0) if { var(txn.rk) -m beg s }",
            f"http-request set-var(txn.rnd) rand({RAND_SCALE}) if {{ var(txn.split) -m found }}",
        ]
        owners += [None, None]
    for key, short in ids.items():
        targets = parse_split_key(key)
        total = sum(w for _, w in targets)
        cumulative = 0
        low = 0
        for pool_id, weight in targets:
            cumulative += weight
            high = cumulative * RAND_SCALE // total
            lines.append(
                f"http-request set-var(txn.pool) int({pool_id}) if {{ var(txn.split) -m int {short[1:]} }} "
                f"{{ var(txn.rnd) -m int {low}:{high - 1} }}  # {short}: {weight}/{total} to pool {pool_id}"
            )
            owners.append(manifest.pool(pool_id))
            low = high
    if any(k.startswith("p") for k in keys):
        # txn.pool is an integer: the per-pool rules below compare it with `-m int`, measured 10x
        # cheaper per rule than `-m str` (0.06 vs 0.67 us), and a request may pass every pool's rules.
        lines.append("http-request set-var(txn.pool) var(txn.rk),field(2,p),add(0) if { var(txn.rk) -m beg p }")
        owners.append(None)
    return lines


# A section's lines and their owners: one per line, or one for the whole section.
Section = tuple[list[str], list[Owner | None] | Owner | None]


def http_frontend(
    listener: ListenerSpec,
    pools: dict[int, PoolSpec],
    *,
    local_region: str,
    bind_address: str | None,
    use_maps: bool,
    files: dict[str, bytes],
    manifest: ManifestBuilder,
) -> Section:
    name = frontend_name(listener)
    manifest.frontends.append(name)
    lines = [
        f"frontend {name}",
        _bind_line(listener, bind_address, manifest),
        "option forwardfor",
        *ACME_CHALLENGE_LINES,
    ]
    files[ACME_CHALLENGE_MAP] = manifest.map_file(ACME_CHALLENGE_MAP, [], [])
    if listener.protocol == "https":
        lines.append("http-request set-header X-Forwarded-Proto https")
    keys = listener_action_keys(listener)
    ids = split_ids(keys)
    if listener.routes:
        lines += [
            "# Host without port, lower-cased; path without query: what every route matches on.",
            "http-request set-var(txn.host) req.hdr(host),field(1,:),lower",
            "http-request set-var(txn.path) path",
        ]
        if use_maps:
            # No route count here: the text must not change when only the maps do.
            lines.append(f"# Routes are classified by map lookups, see {map_prefix(listener)}.*")
            lines += classify_with_maps(listener, files, ids, manifest)
    lb = Owner(lb=listener.lb)
    owners: list[Owner | None] = [lb] * len(lines)
    if listener.routes and not use_maps:
        lines.append("# Routes in priority order; the first match sets txn.rk.")
        owners.append(lb)
        lines += classify_with_rules(listener, ids, manifest, owners)
    if listener.default_pool_id is not None:
        lines.append(f"http-request set-var(txn.rk) str(p{listener.default_pool_id}) if !{{ var(txn.rk) -m found }}")
        owners.append(manifest.pool(listener.default_pool_id))
    else:
        lines.append(no_route_line(listener))
        owners.append(lb)
    lines += split_lines(keys, ids, manifest, owners)
    pool_ids = sorted({pool_id for key in keys for pool_id, _ in parse_split_key(key)})
    # http-request rules run before any use_backend rule whatever their order; keep the text honest.
    for pool_id in pool_ids:
        if not pool_steps(pools[pool_id], local_region, listener.protocol):
            lines.append(
                f"http-request deny deny_status 503 if {{ var(txn.pool) -m int {pool_id} }}"
                f"  # pool {pool_id} has no regions"
            )
            owners.append(manifest.pool(pool_id))
    depth = 0
    for pool_id in pool_ids:
        pool = pools[pool_id]
        steps = pool_steps(pool, local_region, listener.protocol)
        if steps:
            depth = max(depth, len(steps))
            # The chain's order only: its shares are map entries (maps/chain.limits.map), so a capacity change
            # (a member drained in a capacity-bound pool) stays a runtime change, not a reload.
            lines.append(f"# pool {pool_id} ({pool.name}): " + " -> ".join(s.backend for s in steps)
                         + " (shares per step in maps/chain.limits.map)")
            owners.append(manifest.pool(pool_id))
    stage3 = chain_lines(depth, [p for p in pool_ids if pools[p].sticky and pool_steps(pools[p], local_region,
                                                                                        listener.protocol)])
    lines += stage3
    owners += [lb] * len(stage3)
    return [lines[0]] + [INDENT + line for line in lines[1:]], owners


def tcp_frontend(
    listener: ListenerSpec,
    pools: dict[int, PoolSpec],
    *,
    local_region: str,
    bind_address: str | None,
    manifest: ManifestBuilder,
) -> Section:
    name = frontend_name(listener)
    manifest.frontends.append(name)
    lines = [f"frontend {name}", _bind_line(listener, bind_address, manifest)]
    lb = Owner(lb=listener.lb)
    owners: list[Owner | None] = [lb, lb]
    if listener.default_pool_id is not None:
        pool = pools[listener.default_pool_id]
        steps = pool_steps(pool, local_region, "tcp")
        # In TCP mode the choice is made once per connection, so the rate limit counts connections.
        for backend, extra in chain_rule_conditions(steps):
            lines.append(f"use_backend {backend} if {extra}" if extra else f"default_backend {backend}")
            owners.append(manifest.pool(pool.id))
    return [lines[0]] + [INDENT + line for line in lines[1:]], owners
