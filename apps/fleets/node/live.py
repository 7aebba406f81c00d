"""Drift in what a node runs *now*: its live maps and servers against the desired state (no Django).

The on-disk hash and the worker PID (outside_rollout.read_state) cannot see a change made over the stats
socket: `set map`, `set server ... state maint`, `set weight`, `disable frontend`. This module reads the
live state (`show map` for every map of the verified bundle, `show servers state` for every server,
`show stat -1 1 -1` for every frontend), says what differs in lines a person can read, and puts it back
through the same runtime API (a frontend shut down for good, `shutdown frontend`, needs a reload).

Desired servers come from the database's members (what Spillway itself last sent through the runtime
API, balancers writing first): a member changed a moment ago and not yet applied is then repaired
to exactly what the pending change sends, never to an older value. Servers the node does not run yet
(a member not rolled out) or no longer should (pending removal) are left to the rollout.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass, field

from apps.fleets.config.render.chain import ENFORCER_MAPS
from apps.fleets.config.render.frontends import ACME_CHALLENGE_MAP
from apps.fleets.config.spec import ConfigBundle
from apps.fleets.node.apply import NODE_ERRORS, SERVING_FRONTEND, persist_answers, transport_of
from apps.fleets.node.mapdelta import map_entries, same_entries
from apps.fleets.node.outside_rollout import _STATE_FOR_ADMIN
from apps.fleets.node.runtime_api import HAProxySocket, parse_servers_state
from apps.fleets.node.transports import NodeConn

# srv_admin_state bits (HAProxy include/haproxy/server-t.h): forced/config/inherited maintenance, drain.
MAX_DIFF_LINES = 40
# Maps whose values change at run time by design (apps.fleets.enforcement); their keys are still checked.
RUNTIME_VALUE_MAPS = ENFORCER_MAPS

@dataclass(frozen=True)
class ServerWanted:
    admin_state: str  # active | drain | maint
    weight: int


@dataclass
class LiveDrift:
    lines: list[str] = field(default_factory=list)  # the readable diff
    maps: dict[str, list[tuple[str, str]]] = field(default_factory=dict)  # map name -> desired entries
    servers: dict[tuple[str, str], ServerWanted] = field(default_factory=dict)
    challenges: dict[str, str] = field(default_factory=dict)  # open HTTP-01 answers the node lacks
    frontends: dict[str, str] = field(default_factory=dict)  # frontend -> its live status, when not serving

    def __bool__(self) -> bool:
        return bool(self.maps or self.servers or self.challenges or self.frontends)


def _server_differs(live: tuple[str, int], wanted: ServerWanted) -> bool:
    state, weight = live
    if wanted.admin_state == "drain":
        # Drain is the drain flag (runtime) or weight 0 (how a reload renders it).
        return state == "maint" or (state == "active" and weight != 0)
    return state != wanted.admin_state or (wanted.admin_state == "active" and weight != wanted.weight)


def _map_lines(name: str, live: list[tuple[str, str]], wanted: list[tuple[str, str]]) -> list[str]:
    live_d, wanted_d = dict(live), dict(wanted)
    lines = []
    # Only the keys that differ are sorted: sorting all 200k of a 100k-route map took ~0.2 s a node.
    for key in sorted({key for key, _ in live_d.items() ^ wanted_d.items()}):
        if key not in live_d:
            lines.append(f"{name}: missing {key} -> {wanted_d[key]}")
        elif key not in wanted_d:
            lines.append(f"{name}: unexpected {key} -> {live_d[key]}")
        else:
            lines.append(f"{name}: {key} -> {live_d[key]} (should be {wanted_d[key]})")
    if len(live) != len(live_d) and not lines:
        lines.append(f"{name}: duplicate keys live")
    return lines


def read_live_drift(conn: NodeConn, bundle: ConfigBundle, servers: dict[tuple[str, str], ServerWanted],
                    challenges: dict[str, str] | None = None, *, maps: bool = True,
                    first_only: bool = False) -> LiveDrift:
    """What differs between the node's live maps/servers and `bundle` / `servers`. Raises NODE_ERRORS.

    `maps=False` leaves out the bundle's maps (not the ACME challenge map): the periodic check reads them
    less often than the rest (drift.LIVE_MAPS_EVERY_S). `first_only=True` stops at the first map that differs,
    without its readable diff (a first look that only needs yes or no: while route changes roll out, a node's
    maps are ahead of the revision the look started from).

    The ACME challenge map is rendered empty and filled at run time (open HTTP-01 answers,
    `challenges`): only an answer missing there is drift. An extra one is an order's, published after
    `challenges` was read, or withdrawn meanwhile (harmless, and its order removes it)."""
    transport = transport_of(conn)
    drift = LiveDrift()
    try:
        stats = transport.stats()
        for name, wanted in sorted(bundle.rendered_manifest.maps.items()):
            if not maps and name != ACME_CHALLENGE_MAP:
                continue
            lines = stats.show_map_lines(name)
            plain = name not in RUNTIME_VALUE_MAPS and name != ACME_CHALLENGE_MAP
            if plain and same_entries(lines, wanted, bundle.files.get(name)):
                continue
            if plain and first_only:
                drift.maps[name] = wanted
                break
            live = map_entries(lines)
            if name == ACME_CHALLENGE_MAP:
                held = dict(live)
                drift.challenges = {k: v for k, v in (challenges or {}).items() if held.get(k) != v}
                drift.lines += [f"{name}: missing open HTTP-01 answer {k}" for k in sorted(drift.challenges)]
                continue
            if name in RUNTIME_VALUE_MAPS:
                # The enforcement loop sets these values about every second on purpose (each node's share
                # of each region's capacity): only a missing or extra key is drift. Repairing the values
                # put every node back to the static shares for a second, every converge (10 s).
                if sorted(k for k, _ in live) == sorted(k for k, _ in wanted):
                    continue
                drift.maps[name] = wanted
                if first_only:
                    break
                drift.lines += [line for line in _map_lines(name, live, wanted) if "should be" not in line]
                continue
            drift.maps[name] = wanted
            drift.lines += _map_lines(name, live, wanted)
        # Paused or shut down over the socket: route changes prove themselves by read-back without probing
        # listeners (node/apply._hot_apply), so this check is what sees a frontend that stopped listening.
        drift.frontends = _frontends_not_serving(stats, bundle.rendered_manifest.frontends)
        drift.lines += [f"frontend {name}: {status} (should be OPEN: it does not accept connections)"
                        for name, status in sorted(drift.frontends.items())]
        live_servers = parse_servers_state(stats.show_servers_state())
        for key, wanted_server in sorted(servers.items()):
            live_server = live_servers.get(key)
            if live_server is not None and _server_differs(live_server, wanted_server):
                drift.servers[key] = wanted_server
                drift.lines.append(f"server {key[0]}/{key[1]}: {live_server[0]} weight {live_server[1]} "
                                   f"(should be {wanted_server.admin_state} weight {wanted_server.weight})")
    finally:
        with contextlib.suppress(Exception):
            transport.close()
    if len(drift.lines) > MAX_DIFF_LINES:
        drift.lines = [*drift.lines[:MAX_DIFF_LINES], f"... and {len(drift.lines) - MAX_DIFF_LINES} more"]
    return drift


def _frontends_not_serving(stats: HAProxySocket, names: Iterable[str]) -> dict[str, str]:
    """{frontend: live status} of these frontends where it does not accept connections ("absent": not listed)."""
    live = stats.frontend_statuses()
    return {name: live.get(name, "absent") for name in names if live.get(name) not in SERVING_FRONTEND}


def repair_live_drift(conn: NodeConn, drift: LiveDrift) -> str | None:
    """Put the desired maps and server states back through the runtime API, then read them back.
    None when the node serves the desired live state again; else why (then a reload must do it)."""
    transport = transport_of(conn)
    try:
        stats = transport.stats()
        for name, wanted in drift.maps.items():
            stats.replace_map(name, wanted)
            if not same_entries(stats.show_map_lines(name), wanted):
                return f"{name} still differs after the runtime update"
        for token, value in drift.challenges.items():  # entry by entry: other answers stay as they are
            stats.del_map_entry(ACME_CHALLENGE_MAP, token)
            stats.add_map_entry(ACME_CHALLENGE_MAP, token, value)
        held = dict(stats.show_map(ACME_CHALLENGE_MAP)) if drift.challenges else {}
        lacking = [k for k, v in drift.challenges.items() if held.get(k) != v]
        if lacking:
            return f"HTTP-01 answers still missing after the runtime update: {', '.join(sorted(lacking))}"
        if drift.challenges:
            persist_answers(transport, held)
        for (backend, server), wanted in drift.servers.items():
            if wanted.admin_state != "drain":
                stats.set_server_weight(backend, server, wanted.weight)
            stats.set_server_state(backend, server, _STATE_FOR_ADMIN[wanted.admin_state])  # type: ignore[arg-type]
        live = parse_servers_state(stats.show_servers_state())
        left = [f"{b}/{s}" for (b, s), w in drift.servers.items() if _server_differs(live[(b, s)], w)]
        if left:
            return f"server(s) still differ: {', '.join(left)}"
        for name, status in drift.frontends.items():
            if status == "PAUSED":
                stats.enable_frontend(name)
        closed = _frontends_not_serving(stats, drift.frontends) if drift.frontends else {}
        return (f"frontend(s) not accepting connections: {', '.join(f'{n} {s}' for n, s in sorted(closed.items()))}"
                if closed else None)
    except NODE_ERRORS as exc:
        return str(exc)
    finally:
        with contextlib.suppress(Exception):
            transport.close()
