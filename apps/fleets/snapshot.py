"""Plain data a fleet's HAProxy config is rendered from (no Django).

Services build a FleetSnapshot from the database; `apps.fleets.render.render()` turns it into a
ConfigBundle for one node. Values here are not trusted: the renderer re-validates every one of them.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Literal

AdminState = Literal["active", "drain", "maint"]
Algorithm = Literal["roundrobin", "leastconn", "source"]
PathMatch = Literal["prefix", "exact"]
Protocol = Literal["http", "https", "tcp"]
Overload = Literal["absorb", "shed"]

MAIN_FILE = "haproxy.cfg"
KEEPALIVED_FILE = "keepalived.conf"
# Listeners without a static IP bind every address of the node (or the node's bind_address).
ANY_ADDRESS = "0.0.0.0"


@dataclass(frozen=True)
class MemberSpec:
    name: str  # slug, unique within its pool region
    address: str  # IP literal
    port: int
    weight: int  # 0..256
    admin_state: AdminState = "active"


@dataclass(frozen=True)
class HealthCheckSpec:
    path: str
    interval_s: int
    rise: int
    fall: int
    expected_status: int = 200


@dataclass(frozen=True)
class RegionStep:
    """One step of a pool's overflow chain, as seen from this fleet's nodes."""

    region: str
    rate_limit_per_node: int | None  # req/s this node may send to the region; None = unlimited


@dataclass(frozen=True)
class PoolRegionSpec:
    region: str
    members: tuple[MemberSpec, ...]


@dataclass(frozen=True)
class PoolSpec:
    id: int
    name: str
    algorithm: Algorithm
    health: HealthCheckSpec | None
    regions: tuple[PoolRegionSpec, ...]
    # Computed upstream by the overflow planner, nearest region first. Isolation = a single step.
    chain: tuple[RegionStep, ...]
    # Every region at its share: "absorb" spreads the excess over the chain in proportion to capacity,
    # "shed" answers 503 with Retry-After.
    overload: Overload = "absorb"
    # Region capacities (req/s, None = unlimited) the absorb pass weighs the chain's steps by.
    capacities: tuple[tuple[str, int | None], ...] = ()


@dataclass(frozen=True)
class RouteTargetSpec:
    pool_id: int
    weight: int


@dataclass(frozen=True)
class RouteSpec:
    id: int
    priority: int  # lower is evaluated first
    hosts: tuple[str, ...]  # RFC 1123 names, optionally "*.domain"; empty = any host
    path_match: PathMatch
    path: str
    targets: tuple[RouteTargetSpec, ...]
    redirect_url: str | None = None  # when set, the route answers 302 and targets are ignored


@dataclass(frozen=True)
class CertSpec:
    name: str
    pem: bytes  # certificate chain + private key; written next to the config with mode 0600


@dataclass(frozen=True)
class ListenerSpec:
    id: int
    lb: str
    name: str
    protocol: Protocol
    address: str
    port: int
    default_pool_id: int | None
    routes: tuple[RouteSpec, ...] = ()
    cert: CertSpec | None = None
    # What a request no route matches gets when there is no default pool.
    no_route_status: int = 404
    no_route_body: str = "No route for this host and path."


@dataclass(frozen=True)
class VrrpSpec:
    """How one node takes part in VRRP (keepalived) for the static IPs its listeners bind.

    Node-level because it differs per node (own address, priority, peers) and holds a secret; the
    VIPs themselves come from the snapshot's listener addresses, so a revision fixes them.
    """

    interface: str  # the node's network interface that carries the VIPs
    address: str  # this node's unicast source address
    priority: int  # 1..254, from node order (first node highest)
    peers: tuple[str, ...]  # the other nodes' addresses (unicast, no multicast assumption)
    version: int = 3  # 3: sub-second adverts, no authentication in the protocol; 2: PASS auth, 1 s steps
    advert_ms: int = 200
    auth_pass: str = field(default="", repr=False)  # VRRPv2 only; decrypted from the fleet's secret
    drained: bool = False  # gives up every VIP (instances held in FAULT) while staying a peer


@dataclass(frozen=True)
class NodeSpec:
    name: str
    runtime_dir: str  # absolute; holds sockets, server state, maps/ and certs/ on that node
    bind_address: str | None = None  # overrides every listener's address (loopback demo fleets)
    vrrp: VrrpSpec | None = None  # None: the node runs no keepalived (listeners bind as before)


@dataclass(frozen=True)
class FleetSnapshot:
    fleet: str
    region: str
    revision: int
    listeners: tuple[ListenerSpec, ...]
    pools: tuple[PoolSpec, ...]


def bundle_digest(files: dict[str, bytes]) -> str:
    """sha256 over every file in name order; names and lengths are framed so no two bundles collide."""
    digest = hashlib.sha256()
    for name in sorted(files):
        content = files[name]
        digest.update(name.encode() + b"\0" + str(len(content)).encode() + b"\0")
        digest.update(content)
    return digest.hexdigest()


@dataclass(frozen=True)
class ConfigBundle:
    files: dict[str, bytes] = field(hash=False)  # relative name -> content: "haproxy.cfg", maps/, certs/
    sha256: str = ""

    @classmethod
    def of(cls, files: dict[str, bytes]) -> ConfigBundle:
        ordered = {name: files[name] for name in sorted(files)}
        return cls(files=ordered, sha256=bundle_digest(ordered))

    @property
    def main(self) -> str:
        return self.files[MAIN_FILE].decode()

    def is_secret(self, name: str) -> bool:
        """Files holding private keys: write them with mode 0600 and never show them in a diff."""
        return name.startswith("certs/")
