"""Plain description of one cloud load balancer, the only input of the synthesis layer.

Nothing here imports Django or cdktf: apps/cloud builds a `CloudLB` from the database and hands it to
`deploy.synth.synthesize`; tests and benchmarks build one by hand. Sequences are tuples so that every
object is hashable and immutable.

Semantics shared by both providers:
- `CloudRoute.priority`: lower is evaluated first (the order AWS listener rules and GCP route rules both use);
  priorities are unique per load balancer.
- `path_match="prefix"` is a plain string prefix (`/api` also matches `/apix`), as HAProxy's `path_beg`,
  AWS `path-pattern /api*` and GCP `prefixMatch` all behave.
- A route with no hosts applies to every host.
- Members with weight 0 are drained: they are left out of the cloud backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

Provider = Literal["gcp", "aws"]
Protocol = Literal["http", "https"]
PathMatch = Literal["prefix", "exact"]


class HealthCheck(NamedTuple):
    path: str
    interval_s: int
    expected_status: int = 200


class CloudMember(NamedTuple):
    address: str
    port: int
    weight: int = 100


class RouteTarget(NamedTuple):
    pool: str
    weight: int = 100


@dataclass(frozen=True)
class CloudPoolRegion:
    region: str
    # Requests per second one member can take; GCP backends use it as max_rate_per_endpoint.
    max_rate_per_member: float | None
    capacity_scaler: float = 1.0
    members: tuple[CloudMember, ...] = ()


@dataclass(frozen=True)
class CloudPool:
    name: str
    health: HealthCheck
    regions: tuple[CloudPoolRegion, ...]

    def region(self, region: str) -> CloudPoolRegion | None:
        return next((r for r in self.regions if r.region == region), None)


@dataclass(frozen=True)
class CloudListener:
    protocol: Protocol
    port: int
    default_pool: str
    # GCP: self link or name of a google_compute_ssl_certificate; AWS: ACM certificate ARN. https only.
    certificate_ref: str | None = None


@dataclass(frozen=True)
class CloudRoute:
    priority: int
    hosts: tuple[str, ...]
    path_match: PathMatch
    path: str
    targets: tuple[RouteTarget, ...]


@dataclass(frozen=True)
class CloudRegionNetwork:
    """Where a region's cloud resources live; the model of Spillway has no such thing, the cloud target does.

    GCP: `network` is the VPC (name or self link) and `zone` the zone of the hybrid NEGs.
    AWS: `network` is the VPC id, `subnet_ids` (two availability zones at least) and `security_group_ids`
    go to the regional ALB.
    """

    region: str
    network: str
    zone: str | None = None
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class CloudLB:
    name: str
    provider: Provider
    project_or_account: str
    regions: tuple[str, ...]
    static_ip: str | None
    listeners: tuple[CloudListener, ...]
    pools: tuple[CloudPool, ...]
    routes: tuple[CloudRoute, ...]
    networks: tuple[CloudRegionNetwork, ...] = ()

    def pool(self, name: str) -> CloudPool | None:
        return next((p for p in self.pools if p.name == name), None)

    def network(self, region: str) -> CloudRegionNetwork | None:
        return next((n for n in self.networks if n.region == region), None)

    def routes_in_order(self) -> list[CloudRoute]:
        return sorted(self.routes, key=lambda r: r.priority)
