"""The demo data set `loaddemo` installs (idempotent: running it twice changes nothing)."""

from __future__ import annotations

import os
from dataclasses import dataclass

from django.db import transaction

from apps.accounts.models import Organization, Role
from apps.accounts.services import user_create_with_membership
from apps.balancers.models import (
    HostnameClaim,
    IpPool,
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Region,
    RegionDistance,
    Route,
    RouteTarget,
    StaticIP,
)

DEMO_PASSWORDS = {
    "admin": os.environ.get("DEMO_ADMIN_PASSWORD", "spillway-admin-demo"),
    "acme": os.environ.get("DEMO_ACME_PASSWORD", "acme-demo-pass"),
    "globex": os.environ.get("DEMO_GLOBEX_PASSWORD", "globex-demo-pass"),
}
# Demo backends listen here (started by the demo fleet when HAProxy is installed).
DEMO_BACKENDS = {
    ("acme", "us-east"): [("127.0.20.1", 9101), ("127.0.20.2", 9101)],
    ("acme", "eu-west"): [("127.0.21.1", 9101)],
    ("globex", "us-east"): [("127.0.20.1", 9201)],
    ("globex", "eu-west"): [("127.0.21.1", 9201)],
}


@dataclass
class DemoResult:
    admin_username: str
    admin_password: str


@transaction.atomic
def load_demo() -> DemoResult:
    ops, _ = Organization.objects.get_or_create(slug="ops", defaults={"name": "Operations", "kind": "operator"})
    user_create_with_membership(username="admin", password=DEMO_PASSWORDS["admin"], org=ops, role=Role.ADMIN)
    us, _ = Region.objects.get_or_create(slug="us-east", defaults={"name": "US East"})
    eu, _ = Region.objects.get_or_create(slug="eu-west", defaults={"name": "EU West"})
    RegionDistance.objects.get_or_create(src=us, dst=eu, defaults={"rtt_ms": 80})
    RegionDistance.objects.get_or_create(src=eu, dst=us, defaults={"rtt_ms": 80})
    ip_pool, _ = IpPool.objects.get_or_create(name="demo-vips", defaults={"cidr": "127.0.10.0/24", "region": us})
    edge, _ = LoadBalancer.objects.get_or_create(name="edge", defaults={"org": ops, "shared": True})
    vip, _ = StaticIP.objects.get_or_create(address="127.0.10.1", defaults={
        "pool": ip_pool, "org": ops, "state": StaticIP.State.ASSIGNED})
    Listener.objects.get_or_create(lb=edge, name="http", defaults={"port": 8080, "static_ip": vip})
    for index, slug in enumerate(["acme", "globex"], start=1):
        org, _ = Organization.objects.get_or_create(slug=slug, defaults={"name": slug.title(), "kind": "customer"})
        user_create_with_membership(username=slug, password=DEMO_PASSWORDS[slug], org=org, role=Role.ADMIN)
        HostnameClaim.objects.get_or_create(hostname=f"{slug}.example.com",
                                            defaults={"org": org, "status": HostnameClaim.Status.APPROVED})
        pool, _ = Pool.objects.get_or_create(lb=edge, name=f"{slug}-web", defaults={"org": org, "health_path": "/"})
        for region in (us, eu):
            PoolRegion.objects.get_or_create(pool=pool, region=region, defaults={"max_rate_per_member": 50})
            for n, (address, port) in enumerate(DEMO_BACKENDS[(slug, region.slug)], start=1):
                Member.objects.get_or_create(pool=pool, name=f"{region.slug}-{n}", defaults={
                    "region": region, "address": address, "port": port})
        route, created = Route.objects.get_or_create(lb=edge, priority=index * 100, defaults={
            "org": org, "hosts": [f"{slug}.example.com"], "path": "/"})
        if created:
            RouteTarget.objects.create(route=route, pool=pool, weight=100)
    return DemoResult(admin_username="admin", admin_password=DEMO_PASSWORDS["admin"])
