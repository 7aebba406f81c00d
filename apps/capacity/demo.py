"""Demo capacity tests (idempotent): loopback allowlisted, one test per demo customer on the shared edge LB."""

from __future__ import annotations

from django.db import transaction

from apps.accounts.models import Organization
from apps.balancers.models import Listener, Pool, Region
from apps.capacity.models import CapacityTest, TargetAllowlist

# The demo's load balancers listen on 127.0.10.x; load tests may only ever go to loopback here.
DEMO_ALLOW_CIDR = "127.0.0.0/8"


@transaction.atomic
def load_demo() -> str | None:
    TargetAllowlist.objects.get_or_create(cidr=DEMO_ALLOW_CIDR, org=None,
                                          defaults={"note": "demo: the demo fleet listens on loopback"})
    listener = Listener.objects.filter(lb__name="edge", name="http").first()
    region = Region.objects.filter(slug="us-east").first()
    if listener is None:
        return "capacity demo: no edge listener, skipped the demo tests"
    made = 0
    for slug in ("acme", "globex"):
        org = Organization.objects.filter(slug=slug).first()
        if org is None:
            continue
        _, created = CapacityTest.objects.get_or_create(org=org, name="edge-knee", defaults={
            "listener": listener, "hostname": f"{slug}.example.com", "path": "/", "mode": CapacityTest.Mode.OPEN,
            "steps": [[20.0, 5.0], [40.0, 5.0], [80.0, 5.0], [160.0, 5.0]], "step_duration_s": 5.0,
            "slo_p99_ms": 200.0, "slo_error_rate": 0.01, "shards": 2, "safety_factor": 0.8,
            "pool": Pool.objects.filter(lb=listener.lb, name=f"{slug}-web").first(), "region": region,
            "max_connections": 50, "created_by": "demo"})
        made += created
    return f"capacity demo: loopback allowlisted, {made} test(s) defined (edge-knee)"
