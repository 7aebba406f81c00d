"""Pure HAProxy 2.6 config renderer: FleetSnapshot + NodeSpec -> ConfigBundle.

Byte-identical output for the same input, whatever order the snapshot lists things in: every
collection is sorted by a stable key before it is written. No Django, no I/O.
"""

from __future__ import annotations

import gc
import hashlib

from apps.fleets.render.chain import chain_files, table_sections
from apps.fleets.render.frontends import (
    FLOATING,
    backend_name,
    frontend_name,
    http_frontend,
    listener_action_keys,
    pool_steps,
    tcp_frontend,
)
from apps.fleets.render.keepalived import render_keepalived
from apps.fleets.render.routing import parse_split_key, resolve_route
from apps.fleets.render.safety import UnsafeValue, check_node, check_snapshot
from apps.fleets.render.sections import backend_sections, global_section, http_defaults, tcp_defaults
from apps.fleets.snapshot import KEEPALIVED_FILE, MAIN_FILE, ConfigBundle, FleetSnapshot, NodeSpec

__all__ = [
    "ROUTE_MAP_THRESHOLD",
    "UnsafeValue",
    "backend_name",
    "frontend_name",
    "render",
    "resolve_route",
]

# Above this many routes a listener is classified with map lookups instead of one rule per route
# (rule count then scales with pools, not routes; see routing.py for why the answers are the same).
# 0: always maps. A route change then alters only map files, which a node takes through the runtime
# API (`prepare/add/commit map`) in milliseconds instead of a 75-90 ms reload per node (delivery.py);
# the rule form stays available (threshold > route count) and is tested to route identically.
ROUTE_MAP_THRESHOLD = 0


def render(snapshot: FleetSnapshot, node: NodeSpec, *, route_map_threshold: int = ROUTE_MAP_THRESHOLD) -> ConfigBundle:
    """Render one node's config. Raises UnsafeValue (a ValueError) naming the first invalid field."""
    # Rendering allocates hundreds of thousands of short-lived acyclic objects at 20k routes; the
    # cyclic collector would rescan them all repeatedly for nothing (measured: 30% of render time).
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _render(snapshot, node, route_map_threshold)
    finally:
        if gc_was_enabled:
            gc.enable()


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

    files: dict[str, bytes] = {}
    keepalived = None if node.bind_address else render_keepalived(snap, node)
    if keepalived is not None:
        files[KEEPALIVED_FILE] = keepalived.encode()
    http_sections: list[list[str]] = []
    tcp_sections: list[list[str]] = []
    tcp_pools: set[int] = set()
    http_pools: set[int] = set()
    for ln in listeners:
        if ln.protocol == "tcp":
            tcp_sections.append(tcp_frontend(ln, pools, local_region=snap.region, bind_address=bind_mode))
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
                )
            )
            http_pools.update(pid for key in listener_action_keys(ln) for pid, _ in parse_split_key(key))
            if ln.cert is not None:
                files[f"certs/{ln.cert.name}.pem"] = ln.cert.pem
    # A pool only TCP listeners use gets TCP backends only; an unused pool still gets HTTP backends so
    # its members show up in stats and health before the first route points at it.
    for pool_id in sorted(pools):
        if pool_id in http_pools or pool_id not in tcp_pools:
            http_sections += backend_sections(pools[pool_id], "http")
        if pool_id in tcp_pools:
            tcp_sections += backend_sections(pools[pool_id], "tcp")

    # One set of chain maps per node, keyed by pool and backend (chain.py), written even when empty so
    # a new pool changes map contents and the config text only by its own backends.
    chains = {pid: [(s.backend, s.rate_limit_per_node) for s in pool_steps(pools[pid], snap.region, "http")]
              for pid in sorted(http_pools)}
    files.update(chain_files(chains, pools))
    http_sections += table_sections()
    sections = [global_section(node), http_defaults(), *http_sections]
    if tcp_sections:
        sections += [tcp_defaults(), *tcp_sections]
    body = "\n".join("\n".join(section) + "\n" for section in sections)

    rest = hashlib.sha256(body.encode())
    for name in sorted(files):
        rest.update(b"\0" + name.encode() + b"\0" + files[name])
    header = (
        f"# Spillway: fleet {snap.fleet}, revision {snap.revision}, node {node.name}.\n"
        f"# Generated; do not edit. sha256 of everything below and of the bundle's other files:\n"
        f"# {rest.hexdigest()}\n\n"
    )
    files[MAIN_FILE] = (header + body).encode()
    return ConfigBundle.of(files)
