"""Start and stop HAProxy masters for `local` nodes on this host (demo fleet, tests, benchmarks).

A node needs a running master before its first rollout: it is started on an empty config (the
renderer's global + defaults, no listeners) installed with the node's own transport, so the first
rollout is an ordinary push + reload.
"""

from __future__ import annotations

import subprocess

from apps.fleets import queries
from apps.fleets.config.render import render
from apps.fleets.config.spec import ConfigBundle, FleetSnapshot
from apps.fleets.models import Node
from apps.fleets.node.process import start_master, stop_master
from apps.fleets.node.transports.local import LocalTransport


def empty_bundle(node: Node) -> ConfigBundle:
    snap = FleetSnapshot(fleet=node.fleet.name, region=node.fleet.region.slug, revision=0, listeners=(), pools=())
    return render(snap, queries.node_spec(node))


def start_local_node(node: Node, timeout_s: float = 10.0) -> subprocess.Popen[bytes]:
    """Start the node's master on the config it has on disk, or on an empty config if it has none."""
    if node.transport != Node.Transport.LOCAL:
        raise ValueError(f"node {node.name} is not a local node")
    conn = queries.node_conn(node)
    transport = LocalTransport(conn)
    if transport.config_sha256() is None:
        pushed = transport.push(empty_bundle(node))
        if not pushed.ok:
            raise RuntimeError(f"node {node.name}: empty config refused:\n{pushed.validation_output}")
    return start_master(conn.config_path, conn.runtime_dir, conn.haproxy_bin, timeout_s=timeout_s)


def stop_local_node(proc: subprocess.Popen[bytes]) -> None:
    stop_master(proc, soft_timeout_s=1.0, term_timeout_s=1.0)
