"""Builders of fleet snapshots and a way to serve a rendered bundle in a real HAProxy, for the renderer's tests
(tests/fleets/config/test_render*.py; their named backends are the suite's `tiny_backend`, tests/haproxykit.py)."""

from __future__ import annotations

import datetime as dt
import http.client

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from apps.fleets.config.render import ROUTE_MAP_THRESHOLD, render
from apps.fleets.config.spec import (
    CertSpec,
    ConfigBundle,
    FleetSnapshot,
    HealthCheckSpec,
    ListenerSpec,
    MemberSpec,
    NodeSpec,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
    RouteSpec,
    RouteTargetSpec,
)
from tests.haproxykit import HAProxyNodeFactory, TinyBackend

RULE_FORM = 1_000_000  # a threshold no test listener reaches: routes as ordered http-request rules
NODE = NodeSpec(name="n1", runtime_dir="/var/lib/spillway/n1")
HEALTH = HealthCheckSpec(path="/healthz", interval_s=1, rise=1, fall=1, expected_status=200)


# --- snapshot builders ----------------------------------------------------------------------------


def member(name: str, port: int, *, weight: int = 100, state: str = "active") -> MemberSpec:
    return MemberSpec(name=name, address="127.0.0.1", port=port, weight=weight, admin_state=state)  # type: ignore[arg-type]


def pool(
    pool_id: int,
    regions: dict[str, tuple[MemberSpec, ...]],
    chain: tuple[RegionStep, ...] = (),
    health: HealthCheckSpec | None = None,
) -> PoolSpec:
    return PoolSpec(
        id=pool_id,
        name=f"pool-{pool_id}",
        algorithm="roundrobin",
        health=health,
        regions=tuple(PoolRegionSpec(region=r, members=m) for r, m in regions.items()),
        chain=chain,
    )


def backend_pool(pool_id: int, backend: TinyBackend, region: str = "eu") -> PoolSpec:
    return pool(pool_id, {region: (member(backend.name, backend.port),)})


def route(
    route_id: int,
    priority: int,
    path: str,
    pool_id: int | None = None,
    *,
    hosts: tuple[str, ...] = (),
    match: str = "prefix",
    targets: tuple[RouteTargetSpec, ...] = (),
    redirect: str | None = None,
) -> RouteSpec:
    if pool_id is not None:
        targets = (RouteTargetSpec(pool_id=pool_id, weight=1),)
    return RouteSpec(
        id=route_id,
        priority=priority,
        hosts=hosts,
        path_match=match,  # type: ignore[arg-type]
        path=path,
        targets=targets,
        redirect_url=redirect,
    )


def listener(port: int, routes: tuple[RouteSpec, ...] = (), default_pool_id: int | None = None, **kw) -> ListenerSpec:
    fields = {"id": 1, "lb": "web", "name": "http", "protocol": "http", "address": "127.0.0.1"}
    fields.update(kw)
    return ListenerSpec(port=port, default_pool_id=default_pool_id, routes=routes, **fields)  # type: ignore[arg-type]


def snapshot(listeners: tuple[ListenerSpec, ...], pools: tuple[PoolSpec, ...], revision: int = 1) -> FleetSnapshot:
    return FleetSnapshot(fleet="edge", region="eu", revision=revision, listeners=listeners, pools=pools)


def self_signed_pem(name: str = "example.com") -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(days=1))
        .not_valid_after(now + dt.timedelta(days=30))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM) + key_pem


def rich_snapshot() -> FleetSnapshot:
    """Every feature at once: splits, redirects, wildcards, exact paths, chains, drain/maint, https, tcp."""
    pools = (
        pool(
            1,
            {"eu": (member("a", 9001), member("b", 9002, state="drain")), "us": (member("c", 9003),)},
            chain=(RegionStep("eu", 20), RegionStep("us", None)),
            health=HEALTH,
        ),
        pool(2, {"eu": (member("a", 9004, state="maint"),)}),
        pool(3, {"eu": (member("db", 9005),)}),
        pool(4, {}),
    )
    routes = (
        route(10, 10, "/api", targets=(RouteTargetSpec(1, 90), RouteTargetSpec(2, 10)), hosts=("example.com",)),
        route(11, 5, "/old", match="exact", redirect="https://example.com/new%20page?x=1"),
        route(12, 20, "/", 2, hosts=("*.example.com", "example.org")),
        route(13, 30, "/void", 4),
    )
    return snapshot(
        (
            listener(8080, routes, default_pool_id=1),
            listener(
                8443,
                routes,
                default_pool_id=1,
                id=2,
                name="https",
                protocol="https",
                cert=CertSpec(name="example", pem=self_signed_pem()),
            ),
            listener(5432, default_pool_id=3, id=3, name="db", protocol="tcp"),
        ),
        pools,
    )


# --- running it -----------------------------------------------------------------------------------


def serve(
    haproxy_node: HAProxyNodeFactory,
    snap: FleetSnapshot,
    *,
    name: str = "n1",
    threshold: int = ROUTE_MAP_THRESHOLD,
) -> ConfigBundle:
    conn = haproxy_node.conn(name)
    bundle = render(snap, NodeSpec(name=name, runtime_dir=conn.runtime_dir), route_map_threshold=threshold)
    extra = {k: v for k, v in bundle.files.items() if k != "haproxy.cfg"}
    haproxy_node(lambda _node: bundle.main, name=name, files=extra)
    return bundle


class Client:
    """Keep-alive HTTP client; returns what a user sees: backend name, redirect target or status."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)

    def get(self, path: str, host: str = "example.com") -> str:
        for attempt in range(2):
            try:
                self.conn.request("GET", path, headers={"Host": host})
                response = self.conn.getresponse()
                body = response.read().decode()
                break
            except (http.client.HTTPException, OSError):
                self.conn.close()
                self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                if attempt:
                    raise
        if response.status == 200:
            return body
        if response.status == 302:
            return "redirect " + (response.getheader("Location") or "")
        return f"status {response.status}"

    def close(self) -> None:
        self.conn.close()
