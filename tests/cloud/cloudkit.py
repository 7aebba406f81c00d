"""Demo cloud load balancers and readers of a synthesized Terraform document (the cdktf worker fixture is
tests/cloud/conftest.py's)."""

from __future__ import annotations

from typing import Any

from deploy.model import (
    CloudLB,
    CloudListener,
    CloudMember,
    CloudPool,
    CloudPoolRegion,
    CloudRegionNetwork,
    CloudRoute,
    HealthCheck,
    RouteTarget,
)

ROUTES = (
    # A canary split on one host, an exact path on a wildcard host, a catch-all prefix on every host, and
    # a wildcard route whose priority beats an exact-host route below it.
    CloudRoute(10, ("api.example.com",), "prefix", "/v1",
               (RouteTarget("api", 90), RouteTarget("api-canary", 10))),
    CloudRoute(20, ("*.example.com",), "exact", "/status", (RouteTarget("web", 100),)),
    CloudRoute(30, ("shop.example.com", "www.example.com"), "prefix", "/cart", (RouteTarget("web", 100),)),
    CloudRoute(40, (), "prefix", "/static", (RouteTarget("web", 1),)),
)


def demo_gcp_lb(**changes: Any) -> CloudLB:
    pools = (
        CloudPool("web", HealthCheck("/healthz", 5), (
            CloudPoolRegion("us-central1", 120.0, 1.0, (
                CloudMember("10.0.0.1", 8080), CloudMember("10.0.0.2", 8080),
                CloudMember("10.0.0.3", 8080, weight=0))),
            CloudPoolRegion("europe-west1", 80.0, 0.5, (CloudMember("10.1.0.1", 8080),)),
        )),
        CloudPool("api", HealthCheck("/ready", 10), (
            CloudPoolRegion("us-central1", 300.0, 0.8, (CloudMember("10.0.1.1", 9000),)),
            CloudPoolRegion("europe-west1", 250.0, 0.0, ()),
        )),
        CloudPool("api-canary", HealthCheck("/ready", 10), (
            CloudPoolRegion("us-central1", 50.0, 0.1, (CloudMember("10.0.2.1", 9000),)),
        )),
    )
    lb = CloudLB(
        name="demo", provider="gcp", project_or_account="spillway-demo",
        regions=("us-central1", "europe-west1"), static_ip="203.0.113.10",
        listeners=(CloudListener("http", 80, "web"),
                   CloudListener("https", 443, "web", "projects/spillway-demo/global/sslCertificates/demo")),
        pools=pools, routes=ROUTES,
        networks=(CloudRegionNetwork("us-central1", "spillway-vpc", "us-central1-b"),
                  CloudRegionNetwork("europe-west1", "spillway-vpc", "europe-west1-c")),
    )
    return _replace(lb, changes)


def demo_aws_lb(**changes: Any) -> CloudLB:
    pools = (
        CloudPool("web", HealthCheck("/healthz", 10, 200), (
            CloudPoolRegion("us-east-1", 120.0, 1.0, (
                CloudMember("10.0.0.1", 8080), CloudMember("10.0.0.2", 8080),
                CloudMember("10.0.0.3", 8080, weight=0))),
            CloudPoolRegion("eu-west-1", 80.0, 0.5, (CloudMember("10.1.0.1", 8080),)),
        )),
        CloudPool("api", HealthCheck("/ready", 5, 204), (
            CloudPoolRegion("us-east-1", 300.0, 0.8, (CloudMember("10.0.1.1", 9000),)),
            CloudPoolRegion("eu-west-1", 250.0, 0.0, ()),
        )),
        CloudPool("api-canary", HealthCheck("/ready", 30, 200), (
            CloudPoolRegion("us-east-1", 50.0, 0.1, (CloudMember("10.0.2.1", 9000),)),
            CloudPoolRegion("eu-west-1", 50.0, 0.1, (CloudMember("10.1.2.1", 9000),)),
        )),
    )
    lb = CloudLB(
        name="demo", provider="aws", project_or_account="123456789012",
        regions=("us-east-1", "eu-west-1"), static_ip="198.51.100.7",
        listeners=(CloudListener("http", 80, "web"),
                   CloudListener("https", 443, "api", "arn:aws:acm:us-east-1:123456789012:certificate/demo")),
        pools=pools, routes=ROUTES,
        networks=(CloudRegionNetwork("us-east-1", "vpc-0a1", subnet_ids=("subnet-1a", "subnet-1b"),
                                     security_group_ids=("sg-web",)),
                  CloudRegionNetwork("eu-west-1", "vpc-0b2",
                                     subnet_ids=("subnet-2a", "subnet-2b", "subnet-2c"))),
    )
    return _replace(lb, changes)


def _replace(lb: CloudLB, changes: dict[str, Any]) -> CloudLB:
    from dataclasses import replace

    return replace(lb, **changes) if changes else lb


def resources(doc: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    """Resources of one Terraform type, keyed by their `name` argument (what the cloud will show)."""
    return {body.get("name", key): body for key, body in doc["resource"].get(kind, {}).items()}


def deref(doc: dict[str, Any], ref: str) -> tuple[str, dict[str, Any], str]:
    """Resolve "${type.key.attr}" to (type, resource body, attr), so tests compare cloud names, not keys."""
    assert ref.startswith("${") and ref.endswith("}"), ref
    kind, key, attr = ref[2:-1].split(".")
    return kind, doc["resource"][kind][key], attr


def many_routes(count: int, *, hosts_per_route: int = 1, first_priority: int = 1) -> tuple[CloudRoute, ...]:
    """`count` prefix routes to the pool `web`, each with its own hosts (limits tests)."""
    return tuple(
        CloudRoute(first_priority + i, tuple(f"h{i}-{j}.example.com" for j in range(hosts_per_route)),
                   "prefix", f"/r{i}", (RouteTarget("web", 100),))
        for i in range(count))
