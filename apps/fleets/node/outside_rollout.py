"""Node operations outside a rollout (no Django): runtime changes to members and maps, and what a node runs.

Split from node/apply.py, which keeps what a rollout does to a node; these share its transports and errors.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from dataclasses import dataclass

from apps.fleets.config.digest import set_digest_v1
from apps.fleets.config.render.frontends import ACME_CHALLENGE_MAP
from apps.fleets.node.apply import NODE_ERRORS, persist_answers, transport_of
from apps.fleets.node.runtime_api import RuntimeApiError
from apps.fleets.node.showstat import StatRow, parse_show_stat
from apps.fleets.node.transports import NodeConn

# --- runtime API ---------------------------------------------------------------------------------

_STATE_FOR_ADMIN = {"active": "ready", "drain": "drain", "maint": "maint"}


def set_server(conn: NodeConn, backends: Iterable[str], server: str, admin_state: str | None,
               weight: int | None) -> str | None:
    """Apply a member's admin state and weight on one node without a reload; None or the error.

    A backend the node does not have (say the TCP twin of an HTTP-only pool) is skipped; any other
    refusal is reported. Drain keeps the configured weight for later: HAProxy's `drain` state sets
    the effective weight to 0 by itself.
    """
    transport = transport_of(conn)
    errors = []
    try:
        stats = transport.stats()
        for backend in backends:
            try:
                if weight is not None and admin_state != "drain":
                    stats.set_server_weight(backend, server, weight)
                if admin_state is not None:
                    stats.set_server_state(backend, server, _STATE_FOR_ADMIN[admin_state])  # type: ignore[arg-type]
            except RuntimeApiError as exc:
                if "No such" in exc.message:
                    continue
                errors.append(str(exc))
    except NODE_ERRORS as exc:
        errors.append(str(exc))
    finally:
        transport.close()
    return "; ".join(errors) or None


def set_map_entries(conn: NodeConn, name: str, add: dict[str, str], remove: Iterable[str] = ()) -> str | None:
    """Add and remove live entries of one map on one node without a reload; None or the error. The ACME answers'
    map is then written to the node's files as the worker serves it (read back), so a restart keeps them."""
    transport = transport_of(conn)
    try:
        stats = transport.stats()
        for key in remove:
            stats.del_map_entry(name, key)
        for key, value in add.items():
            stats.del_map_entry(name, key)  # re-adding must not leave a stale duplicate first in line
            stats.add_map_entry(name, key, value)
        if name == ACME_CHALLENGE_MAP:
            persist_answers(transport, dict(stats.show_map(name)))
    except NODE_ERRORS as exc:
        return f"node {conn.name}: {exc}"
    finally:
        transport.close()
    return None


# --- drift and health -------------------------------------------------------------------------------


@dataclass(frozen=True)
class NodeState:
    node: str
    reachable: bool
    error: str = ""
    on_disk_sha256: str | None = None
    worker_pid: int | None = None
    failed_reloads: int = 0
    stats: tuple[StatRow, ...] = ()
    on_disk_sha256_v1: str | None = None


def read_state(conn: NodeConn, with_stats: bool = False, recorded_sha256: str = "", fresh: bool = False,
               with_disk: bool = True) -> NodeState:
    """What a node runs: config hash on disk, current worker, failed reloads, optionally show stat.

    `recorded_sha256` (what the database says the node verified): when the files on disk do not hash to it,
    their digest by the earlier definition is read too (NodeState.on_disk_sha256_v1, digest.set_digest_v1).
    `fresh`: the files are read and hashed, never answered from a digest the transport remembers (drift checks).
    Without `with_disk` the node's files are not looked at (on_disk_sha256 None): health reads what the node
    serves, and its files are the drift check's (a local node's set was listed and stat'ed every 5 s for a hash
    nobody read, and a set that could not be read made a serving node count as down)."""
    transport = transport_of(conn)
    try:
        proc = transport.show_proc()
        sha = transport.config_sha256(fresh=fresh) if with_disk else None
        legacy = None
        if recorded_sha256 and sha is not None and sha != recorded_sha256:
            legacy = set_digest_v1(transport._read_tree(conn.current_dir))
        rows = tuple(parse_show_stat(transport.runtime("show stat"))) if with_stats else ()
        worker = proc.current_worker
        return NodeState(conn.name, True, "", sha, worker.pid if worker else None, proc.failed_reloads, rows,
                         legacy)
    except NODE_ERRORS as exc:
        return NodeState(conn.name, False, str(exc))
    finally:
        with contextlib.suppress(Exception):
            transport.close()


def held_addresses(conn: NodeConn) -> set[str] | None:
    """The addresses on the node's interfaces now (which VIPs it holds), None when unreachable."""
    transport = transport_of(conn)
    try:
        return transport.vrrp_addresses()
    except NODE_ERRORS:
        return None
    finally:
        with contextlib.suppress(Exception):
            transport.close()
