"""Plain data a fleet's HAProxy config is rendered from (no Django).

Services build a FleetSnapshot from the database; `apps.fleets.config.render.render()` turns it into a
ConfigBundle for one node. Values here are not trusted: the renderer re-validates every one of them.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import accumulate
from typing import Literal

from apps.fleets.config.digest import set_digest

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
    id: int = 0  # the member's id: its sticky cookie value (`m<id>`)


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
    sticky: bool = False  # session affinity by cookie (HTTP only; fleets.render.chain, "Sticky sessions")


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
    haproxy_bin: str = "haproxy"  # the node's HAProxy binary; keepalived follows processes of that file name
    process_events: bool = True  # keepalived gets kernel process events (runs in the initial network namespace)


@dataclass(frozen=True)
class NodeSpec:
    name: str
    runtime_dir: str  # absolute; holds sockets, server state, maps/ and certs/ on that node
    bind_address: str | None = None  # overrides every listener's address (loopback demo fleets)
    vrrp: VrrpSpec | None = None  # None: the node runs no keepalived (listeners bind as before)
    health: tuple[str, int] | None = None  # (address, port) of the node's health endpoint (render.health); None: none
    drained: bool = False  # the health endpoint answers 503 (upstream load balancers stop choosing the node)
    # (address, port) of the request-log collector (apps.signals) and the node's name in its lines; None: no log.
    signals: tuple[str, int] | None = None
    signals_tag: str = ""


@dataclass(frozen=True)
class FleetSnapshot:
    fleet: str
    region: str
    revision: int
    listeners: tuple[ListenerSpec, ...]
    pools: tuple[PoolSpec, ...]



@dataclass(frozen=True, slots=True)
class Owner:
    """Whose a rendered line is. Shared between lines (one per route, pool, host or map action), so a
    100k-route render holds a pointer per line, not an object.

    A routes-map entry has both a host class (`host`) and an action (`route` for a redirect, `pools`
    for a pool or a split): it concerns a tenant only when both are its own.
    """

    lb: str | None = None
    route: int | None = None
    pools: tuple[int, ...] = ()
    host: str | None = None
    action: str | None = None  # a routes-map entry's value as written (`p12`, `s0`, `u7`)


class RoutesMapOwners(Sequence[Owner]):
    """Owners of a routes map's entries, made when asked: a 100k-route map then costs the renderer
    one list of host classes (shared strings) and one owner per distinct action, not an object per line."""

    __slots__ = ("_actions", "_classes", "_entries", "_lb")

    def __init__(self, entries: list[tuple[str, str]], classes: Sequence[str], actions: dict[str, Owner],
                 lb: str = "") -> None:
        """`actions`: the owner of each value, or of each pool/split value when `lb` is given: a redirect's value
        (`u<route id>`) then names its owner, that route of LB `lb`."""
        self._entries, self._classes, self._actions, self._lb = entries, classes, actions, lb

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        value = self._entries[index][1]
        action = self._actions.get(value)
        if action is None:
            if not self._lb or not value.startswith("u"):
                raise KeyError(value)
            action = Owner(lb=self._lb, route=int(value[1:]), action=value)
        return replace(action, host=self._classes[index])


class RunClasses(Sequence[str]):
    """The host class of each entry of a routes map written as one run per class: `order`'s classes, with
    runs of these lengths. An entry's class is found by its position (a list of one per entry is 200k at
    100k routes, made for each route-lane revision and read only for an owner someone asks about)."""

    __slots__ = ("_ends", "_order")

    def __init__(self, order: list[str], lengths: Iterable[int]) -> None:
        self._order, self._ends = order, list(accumulate(lengths))

    def __len__(self) -> int:
        return self._ends[-1] if self._ends else 0

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(index)
        return self._order[bisect_right(self._ends, index)]


class RedirectOwners(Sequence[Owner]):
    """Owners of a redirects map's entries (`u<route id>`: that route), made when asked, like RoutesMapOwners."""

    __slots__ = ("_entries",)

    def __init__(self, entries: list[tuple[str, str]]) -> None:
        self._entries = entries

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index):  # type: ignore[no-untyped-def]
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return Owner(route=int(self._entries[index][0][1:]))


@dataclass(frozen=True, slots=True)
class Bind:
    address: str  # IP literal without brackets
    port: int
    # On a VIP (`transparent`): only the node holding the VIP answers there, so it is checked
    # through `show stat` like every frontend, not by a TCP connect that would reach the holder.
    floating: bool = False


@dataclass(frozen=True)
class Manifest:
    """What the renderer knows about the text it wrote, so no consumer parses the text back.

    `main_owners` has one entry per line of haproxy.cfg below the header; `maps` holds every map
    file's entries as written and `map_owners` one owner per entry (None: nobody's, e.g. the
    global/defaults sections and the empty ACME map).
    """

    runtime_dir: str
    runtime_lines: tuple[int, ...]  # lines of haproxy.cfg below the header that name runtime_dir
    header_len: int  # characters of haproxy.cfg's header comment (names the revision and node)
    binds: tuple[Bind, ...]
    frontends: tuple[str, ...]
    backends: tuple[str, ...]
    maps: dict[str, list[tuple[str, str]]] = field(hash=False)
    main_owners: list[Owner | None] = field(hash=False, repr=False)
    map_owners: dict[str, Sequence[Owner | None]] = field(hash=False, repr=False)
    # (backend, server) -> (admin state, weight, its line in haproxy.cfg below the header) as rendered: a change
    # of states and weights alone is applied through the runtime API (node.hotchanges), not a reload.
    servers: dict[tuple[str, str], tuple[str, int, int]] = field(default_factory=dict, hash=False, repr=False)


@dataclass(frozen=True)
class ConfigBundle:
    files: dict[str, bytes] = field(hash=False)  # relative name -> content: "haproxy.cfg", maps/, certs/
    sha256: str = ""
    # None only for bundles not made by the renderer (a node's bootstrap config in tests).
    manifest: Manifest | None = field(default=None, hash=False, compare=False, repr=False)
    # A route-lane bundle's moved map keys: map name -> (the base bundle's file it changes, the key-by-key
    # change from it, node.mapdelta.MapDelta, or None for "replace it whole"). The node applies the change where
    # it serves exactly that base file; it travels with the bundle so no one computes it from 200k-entry maps.
    map_deltas: dict[str, tuple[bytes, object | None]] = field(default_factory=dict, hash=False, compare=False,
                                                               repr=False)

    @classmethod
    def of(cls, files: dict[str, bytes], manifest: Manifest | None = None,
           map_deltas: dict[str, tuple[bytes, object | None]] | None = None) -> ConfigBundle:
        ordered = {name: files[name] for name in sorted(files)}
        return cls(files=ordered, sha256=set_digest(ordered), manifest=manifest, map_deltas=map_deltas or {})

    @property
    def rendered_manifest(self) -> Manifest:
        """The renderer's manifest: every bundle a rollout or a check handles comes from the renderer (raises
        for one that did not)."""
        if self.manifest is None:
            raise ValueError("bundle has no manifest; was it made by apps.fleets.config.render?")
        return self.manifest

    @property
    def body(self) -> str:
        """haproxy.cfg without the renderer's header comment: what HAProxy is told to do."""
        return self.main[self.rendered_manifest.header_len:]

    @property
    def main(self) -> str:
        return self.files[MAIN_FILE].decode()

    def is_secret(self, name: str) -> bool:
        """Files holding private keys: write them with mode 0600 and never show them in a diff."""
        return name.startswith("certs/")
