"""A node's health endpoint, for whatever chooses between nodes upstream (a load balancer, DNS, anycast).

    GET http://<node address>:<health_port>/spillway/healthz  ->  200 in service, 503 drained

HAProxy answers it itself (`monitor-uri`); `monitor fail` reads the node's drained flag from a map, so a drain
or an undrain changes a map entry, applied through the runtime API with no reload (node.hotchanges), and
the node's files on disk say the same after a reboot. Requests already on the node finish: draining stops new
choices upstream, it does not cut connections. Pure: no Django.
"""

from __future__ import annotations

from typing import Final

from apps.fleets.config.render.frontends import format_address
from apps.fleets.config.render.manifest import ManifestBuilder
from apps.fleets.config.spec import Bind, NodeSpec

HEALTH_FRONTEND: Final = "spillway_health"
HEALTH_URI: Final = "/spillway/healthz"
NODE_MAP: Final = "maps/spillway.node.map"


def health_section(node: NodeSpec, files: dict[str, bytes], manifest: ManifestBuilder) -> list[str] | None:
    """The health frontend's lines (None when the node has no health port); writes the node map."""
    if node.health is None:
        return None
    address, port = node.health
    files[NODE_MAP] = manifest.map_file(NODE_MAP, [("drained", "1" if node.drained else "0")], [None])
    manifest.frontends.append(HEALTH_FRONTEND)
    manifest.binds.append(Bind(address, port))
    return [
        f"frontend {HEALTH_FRONTEND}",
        f"    bind {format_address(address, port)}",
        f"    monitor-uri {HEALTH_URI}",
        f"    acl spillway_drained str(drained),map({NODE_MAP},0) -m str 1",
        "    monitor fail if spillway_drained",
    ]
