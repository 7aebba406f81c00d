"""The tenancy walks' shared parts: every writable relation field of the API's serializers (test_relation_scoping,
test_hostile_references), and the hostile-reference cases with the two tenants' objects they swap in
(test_hostile_references, test_acting_for)."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from rest_framework import serializers
from rest_framework.relations import ManyRelatedField, RelatedField

from apps.balancers.models import IpPool, Listener, LoadBalancer, Pool, Route, StaticIP
from apps.capacity.models import CapacityTest
from apps.cloud.models import CloudCredential, CloudTarget
from apps.core import crypto
from apps.fleets.models import Certificate
from controlplane.api import router
from tests.factories import (
    HostnameClaimFactory,
    IpPoolFactory,
    LoadBalancerFactory,
    PoolFactory,
    RegionFactory,
)
from tests.fleets.fleetkit import self_signed

# --- the API's writable relation fields ---------------------------------------------------------------------


def serializer_classes() -> Iterator[tuple[str, type[serializers.BaseSerializer]]]:
    for prefix, viewset, _basename in router.registry:
        classes = {getattr(viewset, "serializer_class", None)}
        for name in dir(viewset):
            method = getattr(viewset, name, None)
            kwargs = getattr(method, "kwargs", None)
            if getattr(method, "mapping", None) is not None and isinstance(kwargs, dict):
                classes.add(kwargs.get("serializer_class"))
        for cls in classes - {None}:
            yield prefix, cls


def writable_relations(serializer: serializers.BaseSerializer, path: str) -> Iterator[tuple[str, object]]:
    if isinstance(serializer, serializers.ListSerializer):
        serializer = serializer.child
    for name, field in serializer.fields.items():
        if field.read_only:
            continue
        where = f"{path}.{name}"
        if isinstance(field, ManyRelatedField):
            yield where, field.child_relation
        elif isinstance(field, RelatedField):
            yield where, field
        elif isinstance(field, serializers.BaseSerializer):
            yield from writable_relations(field, where)
        elif isinstance(field, serializers.ListField) and isinstance(field.child, serializers.BaseSerializer):
            yield from writable_relations(field.child, where)


def all_writable_relations() -> list[tuple[str, object]]:
    found = []
    for prefix, cls in serializer_classes():
        found.extend(writable_relations(cls(), f"{prefix}:{cls.__name__}"))
    return found


# --- hostile references -----------------------------------------------------------------------------------

MISSING_ID = 987_654_321


@dataclass
class Side:
    lb: LoadBalancer
    pool: Pool
    cert: Certificate
    ip: StaticIP
    target: CloudTarget
    credential: CloudCredential
    listener: Listener
    route: Route
    test: CapacityTest


def _side(org, n: int, ip_pool: IpPool) -> Side:
    lb = LoadBalancerFactory(name=f"{org.slug}-lb", org=org)
    pool = PoolFactory(lb=lb, org=org, name="web")
    cert_pem, key_pem = self_signed(days=90, name=f"{org.slug}.example")
    cert = Certificate.objects.create(org=org, name=f"{org.slug}-cert", cert_pem=cert_pem,
                                      key_encrypted=crypto.encrypt(key_pem))
    ip = StaticIP.objects.create(pool=ip_pool, address=f"192.0.2.{n}", org=org, state=StaticIP.State.RESERVED)
    target = CloudTarget.objects.create(org=org, name=f"{org.slug}-gcp", provider="gcp",
                                        project_or_account=f"{org.slug}-project", regions=["us-east"])
    credential = CloudCredential.objects.create(name=f"{org.slug}-creds", provider="gcp", credentials_ref="X")
    credential.orgs.set([org])
    listener = Listener.objects.create(lb=lb, name="http", port=8000 + n)
    route = Route.objects.create(lb=lb, org=org, path="/", priority=10 + n)
    test = CapacityTest.objects.create(org=org, name=f"{org.slug}-knee", steps=[[10, 1]])
    return Side(lb, pool, cert, ip, target, credential, listener, route, test)


def make_sides(acme, globex) -> tuple[Side, Side]:
    """acme's and globex's objects of every kind a write can reference."""
    RegionFactory(slug="us-east")
    ip_pool = IpPoolFactory(name="ips", cidr="192.0.2.0/28")
    HostnameClaimFactory(org=acme, hostname="shop.acme.test", status="approved")
    return _side(acme, 2, ip_pool), _side(globex, 3, ip_pool)


# Each case: (endpoint, payload from acme's side, the field under attack, its foreign value from
# globex's side, the value of a missing object).
Case = tuple[str, Callable[[Side], dict[str, Any]], str, Callable[[Side], Any], Any]

CASES: list[Case] = [
    ("/api/v1/load-balancers/", lambda a: {"name": "new-lb"}, "org", lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/load-balancers/", lambda a: {"name": "new-lb", "kind": "gcp"}, "cloud_target",
     lambda g: g.target.pk, MISSING_ID),
    ("/api/v1/listeners/", lambda a: {"lb": a.lb.pk, "name": "web", "port": 9443}, "lb",
     lambda g: g.lb.pk, MISSING_ID),
    ("/api/v1/listeners/", lambda a: {"lb": a.lb.pk, "name": "web", "port": 9443, "protocol": "https",
                                      "certificate": a.cert.pk}, "certificate", lambda g: g.cert.pk, MISSING_ID),
    ("/api/v1/listeners/", lambda a: {"lb": a.lb.pk, "name": "web", "port": 9443}, "static_ip",
     lambda g: g.ip.pk, MISSING_ID),
    ("/api/v1/listeners/", lambda a: {"lb": a.lb.pk, "name": "web", "port": 9443}, "default_pool",
     lambda g: g.pool.pk, MISSING_ID),
    ("/api/v1/pools/", lambda a: {"lb": a.lb.pk, "name": "api"}, "lb", lambda g: g.lb.pk, MISSING_ID),
    ("/api/v1/pools/", lambda a: {"lb": a.lb.pk, "name": "api"}, "org", lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/pool-regions/", lambda a: {"pool": a.pool.pk, "region": "us-east", "max_rate_per_member": 5},
     "pool", lambda g: g.pool.pk, MISSING_ID),
    ("/api/v1/members/", lambda a: {"pool": a.pool.pk, "region": "us-east", "name": "m9",
                                    "address": "192.0.2.200", "port": 80}, "pool", lambda g: g.pool.pk, MISSING_ID),
    ("/api/v1/routes/", lambda a: {"lb": a.lb.pk, "path": "/x", "priority": 900,
                                   "targets": [{"pool": a.pool.pk}]}, "lb", lambda g: g.lb.pk, MISSING_ID),
    ("/api/v1/routes/", lambda a: {"lb": a.lb.pk, "path": "/x", "priority": 900,
                                   "targets": [{"pool": a.pool.pk}]}, "org", lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/routes/", lambda a: {"lb": a.lb.pk, "path": "/x", "priority": 900, "targets": [{"pool": None}]},
     "targets.pool", lambda g: g.pool.pk, MISSING_ID),
    ("/api/v1/hostname-claims/", lambda a: {"hostname": "new.acme.test"}, "org", lambda g: g.lb.org.slug,
     "no-such-org"),
    ("/api/v1/static-ips/allocate/", lambda a: {"pool": "ips"}, "org", lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/certificates/", lambda a: dict(zip(("cert_pem", "key_pem"), self_signed(30), strict=True),
                                             name="other"), "org", lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/managed-certificates/", lambda a: {"name": "m1", "hostnames": ["shop.acme.test"]}, "org",
     lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/managed-certificates/", lambda a: {"name": "m1", "hostnames": ["shop.acme.test"]}, "certificate",
     lambda g: g.cert.pk, MISSING_ID),
    ("/api/v1/capacity-tests/", lambda a: {"name": "t1", "pool": a.pool.pk, "steps": [10]}, "org",
     lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/capacity-tests/", lambda a: {"name": "t1", "listener": a.listener.pk, "steps": [10]}, "pool",
     lambda g: g.pool.pk, MISSING_ID),
    ("/api/v1/capacity-tests/", lambda a: {"name": "t1", "steps": [10]}, "listener", lambda g: g.listener.pk,
     MISSING_ID),
    ("/api/v1/capacity-tests/", lambda a: {"name": "t1", "steps": [10]}, "route", lambda g: g.route.pk, MISSING_ID),
    ("/api/v1/jobs/", lambda a: {"name": "j1", "kind": "http_check", "params": {"url": "https://shop.acme.test/"},
                                 "interval_s": 300}, "org", lambda g: g.lb.org.slug, "no-such-org"),
    ("/api/v1/drills/", lambda a: {"pool": a.pool.pk, "region": "us-east", "share": 0.5}, "pool",
     lambda g: g.pool.pk, MISSING_ID),
    ("/api/v1/drills/", lambda a: {"pool": a.pool.pk, "region": "us-east", "share": 0.5}, "test",
     lambda g: g.test.pk, MISSING_ID),
    ("/api/v1/cloud-targets/", lambda a: {"name": "t2", "provider": "gcp", "project_or_account": "p",
                                          "regions": ["us-east1"]},
     "credential", lambda g: g.credential.pk, MISSING_ID),
    ("/api/v1/cloud-applies/", lambda a: {"target": a.target.pk, "lb": a.lb.pk}, "target",
     lambda g: g.target.pk, MISSING_ID),
    ("/api/v1/cloud-applies/", lambda a: {"target": a.target.pk, "lb": a.lb.pk}, "lb", lambda g: g.lb.pk,
     MISSING_ID),
]


def put_reference(payload: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    if field == "targets.pool":
        payload["targets"] = [{"pool": value}]
    else:
        payload[field] = value
    return payload


def response_shape(response, sent: Any) -> tuple[int, dict[str, Any]]:
    """Status and body with the value the caller sent blanked out (errors may echo it back)."""
    return response.status_code, re.sub(rf"\b{re.escape(str(sent))}\b", "<sent>", response.content.decode())
