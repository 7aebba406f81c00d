"""Pure HAProxy 2.6 config renderer: FleetSnapshot + NodeSpec -> ConfigBundle with its Manifest.

Byte-identical output for the same input, whatever order the snapshot lists things in: every
collection is sorted by a stable key before it is written. No Django, no I/O.

The manifest (apps.fleets.config.spec.Manifest) says what the text holds: binds, frontends, backends,
every map's entries and the owner of every line. Consumers read it; none parses the text back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace

from apps.core.gcpause import collector_paused
from apps.fleets.config.digest import file_digest
from apps.fleets.config.render.chain import chain_files, drained_file, table_sections
from apps.fleets.config.render.frontends import (
    FLOATING,
    Section,
    backend_name,
    frontend_name,
    http_frontend,
    listener_action_keys,
    pool_steps,
    tcp_frontend,
)
from apps.fleets.config.render.guard import UnsafeValue, check_node, check_snapshot
from apps.fleets.config.render.health import health_section
from apps.fleets.config.render.incremental import MapUpdate
from apps.fleets.config.render.keepalived import render_keepalived
from apps.fleets.config.render.manifest import ManifestBuilder
from apps.fleets.config.render.routing import parse_split_key, resolve_route
from apps.fleets.config.render.sections import (
    GLOBAL_RUNTIME_LINES,
    backend_sections,
    global_section,
    http_defaults,
    tcp_defaults,
)
from apps.fleets.config.spec import KEEPALIVED_FILE, MAIN_FILE, ConfigBundle, FleetSnapshot, Manifest, NodeSpec, Owner

__all__ = [
    "HEADER_LINES",
    "ROUTE_MAP_THRESHOLD",
    "UnsafeValue",
    "backend_name",
    "frontend_name",
    "patch_maps",
    "render",
    "resolve_route",
    "with_revision_header",
]

# Above this many routes a listener is classified with map lookups instead of one rule per route
# (rule count then scales with pools, not routes; see routing.py for why the answers are the same).
# 0: always maps. A route change then alters only map files, which a node takes through the runtime
# API (`prepare/add/commit map`) in milliseconds instead of a 75-90 ms reload per node (node/apply.py);
# the rule form stays available (threshold > route count) and is tested to route identically.
ROUTE_MAP_THRESHOLD = 0
# The header comment above haproxy.cfg's body: three comment lines and a blank one, always. Stored
# revision texts (which have no manifest) are cut below it by this count (stored.strip_header).
HEADER_LINES = 4


def _header(fleet: str, node_name: str, body: str) -> str:
    """Names the fleet and node, not the revision: a route change (map files only) then leaves haproxy.cfg as it was,
    and a node links it into its new set instead of writing it (the revision in it made every route change write
    and fsync it on every node). Which revision a node serves is its served.json (node/transports/base.py)."""
    header = (
        f"# Spillway: fleet {fleet}, node {node_name}. Generated; do not edit.\n"
        f"# The revision served is in served.json in the node's config directory. sha256 of everything below:\n"
        f"# {hashlib.sha256(body.encode()).hexdigest()}\n\n"
    )
    assert header.count("\n") == HEADER_LINES
    return header


def with_revision_header(bundle: ConfigBundle, *, fleet: str, revision: int, node_name: str) -> ConfigBundle:
    """`bundle` with the header renderers wrote before 2026-11-26 (it named the revision and hashed every file). A
    node applied then serves those bytes, and its recorded digest is this bundle's, until its next push: that push
    is a file write, not a reload (hot_changes compares bodies), once the rollout knows which bundle the node holds
    (rollout/execute.BundleRenderer.applied)."""
    body = bundle.body
    rest = hashlib.sha256(body.encode())
    for name in sorted(bundle.files):
        if name != MAIN_FILE:
            rest.update(b"\0" + name.encode() + b"\0" + file_digest(bundle.files[name]))
    header = (
        f"# Spillway: fleet {fleet}, revision {revision}, node {node_name}.\n"
        f"# Generated; do not edit. sha256 of everything below and of the bundle's other files:\n"
        f"# {rest.hexdigest()}\n\n"
    )
    files = {**bundle.files, MAIN_FILE: (header + body).encode()}
    return ConfigBundle.of(files, replace(bundle.rendered_manifest, header_len=len(header)),
                           map_deltas=dict(bundle.map_deltas))


def patch_maps(bundle: ConfigBundle, maps: Iterable[MapUpdate]) -> ConfigBundle:
    """`bundle` with these maps' new contents: what render() gives for the snapshot whose routes changed only
    maps (render/incremental.py), without laying out every route again. haproxy.cfg is the very bytes `bundle` has
    (its header names no revision), so a node's push links it without comparing it."""
    manifest = bundle.rendered_manifest
    files = dict(bundle.files)
    entries, owners = dict(manifest.maps), dict(manifest.map_owners)
    deltas = {}
    for update in maps:
        if update.name not in files:
            raise KeyError(f"{update.name} is not in the bundle")
        deltas[update.name] = (files[update.name], update.delta)
        files[update.name] = update.content
        entries[update.name], owners[update.name] = update.entries, update.owners
    return ConfigBundle.of(files, replace(manifest, maps=entries, map_owners=owners), map_deltas=deltas)


def render(snapshot: FleetSnapshot, node: NodeSpec, *, route_map_threshold: int = ROUTE_MAP_THRESHOLD) -> ConfigBundle:
    """Render one node's config. Raises UnsafeValue (a ValueError) naming the first invalid field."""
    # Rendering allocates hundreds of thousands of short-lived acyclic objects at 20k routes; the
    # cyclic collector would rescan them all repeatedly for nothing (measured: 30% of render time).
    with collector_paused():
        return _render(snapshot, node, route_map_threshold)


def _render(snapshot: FleetSnapshot, node: NodeSpec, route_map_threshold: int) -> ConfigBundle:
    snap = check_snapshot(snapshot)
    node = check_node(node)
    pools = {p.id: p for p in snap.pools}
    listeners = sorted(snap.listeners, key=lambda ln: (ln.lb, ln.name))
    # A node taking part in VRRP binds its listeners' static IPs with `transparent` (frontends._bind_line);
    # a loopback bind_address override wins (demo nodes have no VIPs to float).
    bind_mode = node.bind_address or (FLOATING if node.vrrp is not None else None)

    binds: dict[tuple[str, int], str] = {}
    for ln in listeners:
        bind = (node.bind_address or ln.address, ln.port)
        if bind in binds:
            raise UnsafeValue(
                f"listeners[{ln.lb}.{ln.name}]",
                "duplicate_bind",
                f"{bind[0]}:{bind[1]} is also bound by listener {binds[bind]} on node {node.name}.",
            )
        binds[bind] = f"{ln.lb}.{ln.name}"
    if node.health is not None:
        taken = [name for (address, port), name in binds.items()
                 if port == node.health[1] and address in (node.health[0], None, "", "0.0.0.0", "::")]
        if taken:
            raise UnsafeValue("node.health_port", "duplicate_bind",
                              f"port {node.health[1]} of node {node.name} is its health endpoint and also listener "
                              f"{taken[0]}'s; give the node another health port.")

    files: dict[str, bytes] = {}
    manifest = ManifestBuilder()
    keepalived = None if node.bind_address else render_keepalived(snap, node)
    if keepalived is not None:
        files[KEEPALIVED_FILE] = keepalived.encode()
    http_sections: list[Section] = []
    tcp_sections: list[Section] = []
    tcp_pools: set[int] = set()
    http_pools: set[int] = set()
    for ln in listeners:
        if ln.protocol == "tcp":
            tcp_sections.append(tcp_frontend(ln, pools, local_region=snap.region, bind_address=bind_mode,
                                             manifest=manifest))
            if ln.default_pool_id is not None:
                tcp_pools.add(ln.default_pool_id)
        else:
            http_sections.append(
                http_frontend(
                    ln,
                    pools,
                    local_region=snap.region,
                    bind_address=bind_mode,
                    use_maps=len(ln.routes) > route_map_threshold,
                    files=files,
                    manifest=manifest,
                )
            )
            http_pools.update(pid for key in listener_action_keys(ln) for pid, _ in parse_split_key(key))
            if ln.cert is not None:
                files[f"certs/{ln.cert.name}.pem"] = ln.cert.pem
    # A pool only TCP listeners use gets TCP backends only; an unused pool still gets HTTP backends so
    # its members show up in stats and health before the first route points at it.
    http_backends = [pools[p] for p in sorted(pools) if p in http_pools or p not in tcp_pools]
    files.update(drained_file(http_backends, manifest))
    for pool_id in sorted(pools):
        owner = manifest.pool(pool_id)
        if pool_id in http_pools or pool_id not in tcp_pools:
            http_sections += [(lines, owner) for lines in backend_sections(pools[pool_id], "http", manifest)]
        if pool_id in tcp_pools:
            tcp_sections += [(lines, owner) for lines in backend_sections(pools[pool_id], "tcp", manifest)]

    # One set of chain maps per node, keyed by pool and backend (chain.py), written even when empty so
    # a new pool changes map contents and the config text only by its own backends.
    chains = {pid: [(s.backend, s.rate_limit_per_node) for s in pool_steps(pools[pid], snap.region, "http")]
              for pid in sorted(http_pools)}
    files.update(chain_files(chains, pools, manifest))
    http_sections += [(lines, None) for lines in table_sections(manifest)]
    health = health_section(node, files, manifest)
    if health is not None:
        http_sections.append((health, None))
    sections: list[Section] = [(global_section(node), None), (http_defaults(node.signals is not None), None),
                               *http_sections]
    if tcp_sections:
        sections += [(tcp_defaults(), None), *tcp_sections]
    body = "\n".join("\n".join(lines) + "\n" for lines, _ in sections)
    # One owner per body line: a section's lines, then the blank line between sections.
    main_owners: list[Owner | None] = []
    servers: dict[tuple[str, str], tuple[str, int, int]] = {}
    for number, (lines, owners) in enumerate(sections):
        if number:
            main_owners.append(None)
        for index, backend, server, state, weight in manifest.server_lines.get(id(lines), ()):
            servers[(backend, server)] = (state, weight, len(main_owners) + index)
        main_owners += owners if isinstance(owners, list) else [owners] * len(lines)

    header = _header(snap.fleet, node.name, body)
    files[MAIN_FILE] = (header + body).encode()
    return ConfigBundle.of(files, Manifest(
        runtime_dir=node.runtime_dir,
        runtime_lines=GLOBAL_RUNTIME_LINES,  # the global section comes first
        header_len=len(header),
        binds=tuple(manifest.binds),
        frontends=tuple(manifest.frontends),
        backends=tuple(manifest.backends),
        maps=manifest.maps,
        main_owners=main_owners,
        map_owners=manifest.map_owners,
        servers=servers,
    ))
