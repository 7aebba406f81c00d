"""A hostile tenant puts another tenant's id in every reference it can write.

For each writable reference of the API (relation fields and the plain-id references the services
resolve), acme's owner sends a valid payload with one reference swapped for one of globex's objects,
then for an id that does not exist. Both must be refused, with the same status and the same code, and
nothing must be created. The last test checks that this table covers every writable relation field
the serializers have (tests/core/test_relation_scoping.py walks them), so a new field needs an attack
case here before the suite passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from apps.balancers.models import IpPool, Listener, LoadBalancer, Pool, Route, StaticIP
from apps.capacity.models import CapacityTest
from apps.cloud.models import CloudCredential, CloudTarget
from apps.core import crypto
from apps.fleets.models import Certificate
from tests.core.test_relation_scoping import all_writable_relations
from tests.factories import (
    HostnameClaimFactory,
    IpPoolFactory,
    LoadBalancerFactory,
    PoolFactory,
    RegionFactory,
)
from tests.fleets.fleetkit import self_signed

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


@pytest.fixture
def sides(acme, globex, ops):
    return make_sides(acme, globex)


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

# Writable relation fields whose rows are shared infrastructure: every org may reference them.
SHARED = {"region", "src", "dst", "static-ips.pool"}
# Fields only operators may set (placement): tested in test_a_customer_cannot_place_or_share_its_lb.
OPERATOR_FIELDS = {"load-balancers.fleet"}
# Endpoints only operators may write: a customer's POST is refused before any field is read.
OPERATOR_ENDPOINTS = ["region-distances", "ip-pools", "fleets", "nodes", "rollouts", "capacity-allowlist",
                      "cloud-credentials"]


def _put(payload: dict[str, Any], field: str, value: Any) -> dict[str, Any]:
    if field == "targets.pool":
        payload["targets"] = [{"pool": value}]
    else:
        payload[field] = value
    return payload


def _shape(response, sent: Any) -> tuple[int, dict[str, Any]]:
    """Status and body with the value the caller sent blanked out (errors may echo it back)."""
    return response.status_code, re.sub(rf"\b{re.escape(str(sent))}\b", "<sent>", response.content.decode())


@pytest.mark.parametrize("url,payload,field,foreign,missing", CASES,
                         ids=[f"{c[0].split('/')[3]}.{c[2]}" for c in CASES])
def test_a_foreign_reference_answers_like_a_missing_one(sides, alice, url, payload, field, foreign, missing):
    acme_side, globex_side = sides
    before = {m: m.objects.count() for m in (LoadBalancer, Listener, Pool, Route, CapacityTest, StaticIP)}

    attacked = alice.client.post(url, _put(payload(acme_side), field, foreign(globex_side)), format="json")
    absent = alice.client.post(url, _put(payload(acme_side), field, missing), format="json")

    assert attacked.status_code in (400, 404, 422), attacked.content
    assert _shape(attacked, foreign(globex_side)) == _shape(absent, missing)
    assert {m: m.objects.count() for m in before} == before


def test_the_cases_cover_every_writable_relation_field():
    covered = {(url.split("/")[3], field) for url, _, field, _, _ in CASES}
    missing = []
    for where, _field in all_writable_relations():
        prefix, rest = where.split(":", 1)
        name = rest.split(".", 1)[1]
        if prefix in OPERATOR_ENDPOINTS or {name.split(".")[-1], f"{prefix}.{name}"} & (SHARED | OPERATOR_FIELDS):
            continue
        if (prefix, name) not in covered and not any(p == prefix and f.endswith(name) for p, f in covered):
            missing.append(where)
    assert not missing, f"no hostile-reference case for {missing}: add one to CASES"


@pytest.mark.parametrize("endpoint", OPERATOR_ENDPOINTS)
def test_a_customer_cannot_write_operator_endpoints(alice, endpoint):
    response = alice.client.post(f"/api/v1/{endpoint}/", {}, format="json")
    assert response.status_code == 403 and response.json()["code"] == "permission_denied"


@pytest.mark.parametrize("change", [{"fleet": 1}, {"shared": True}], ids=["fleet", "shared"])
def test_a_customer_cannot_place_or_share_its_lb(sides, alice, otto, change):
    """Placement on a fleet and the shared flag are the operator's: a customer could otherwise put
    its LB on the operator's fleet (and break its render for everyone) or open it to other tenants."""
    from apps.fleets.models import Fleet

    fleet = Fleet.objects.create(name="edge-us", region=RegionFactory(slug="us-west"))
    change = {k: (fleet.pk if k == "fleet" else v) for k, v in change.items()}
    acme_side, _ = sides

    created = alice.client.post("/api/v1/load-balancers/", {"name": "mine", **change}, format="json")
    patched = alice.client.patch(f"/api/v1/load-balancers/{acme_side.lb.pk}/", change, format="json")

    for response in (created, patched):
        assert response.status_code == 400, response.content
        assert response.json()["code"] == "operator_only"
        assert list(response.json()["fields"]) == list(change)
    acme_side.lb.refresh_from_db()
    assert acme_side.lb.fleet_id is None and not acme_side.lb.shared
    # Sending the value it already has is fine (a PUT of what was read), and operators may place it.
    assert alice.client.patch(f"/api/v1/load-balancers/{acme_side.lb.pk}/", {"shared": False},
                              format="json").status_code == 200
    assert otto.client.patch(f"/api/v1/load-balancers/{acme_side.lb.pk}/", change, format="json").status_code == 200


def _choice_filters() -> list[tuple[str, str, type]]:
    """(endpoint, filter name, related model) for every model-choice filter of every list endpoint."""
    from django_filters import rest_framework as filters

    from apps.core.api.filters import _related_model
    from controlplane.api import router

    found = []
    for prefix, viewset, _ in router.registry:
        view = viewset()
        view.action, view.request, view.format_kwarg, view.kwargs = "list", None, None, {}
        model = getattr(viewset, "model", None)
        if model is None:
            continue
        filterset_class = filters.DjangoFilterBackend().get_filterset_class(view, model.objects.none())
        if filterset_class is None:
            continue
        for name, flt in filterset_class.base_filters.items():
            if isinstance(flt, filters.ModelChoiceFilter | filters.ModelMultipleChoiceFilter):
                found.append((prefix, name, _related_model(model, flt)))
    return found


def test_filters_answer_a_foreign_id_like_a_missing_one(sides, alice):
    """?lb=<another tenant's LB> used to answer 200 (empty) while a missing id answered 400: an oracle."""
    from apps.balancers.models import Region
    from apps.events.models import Event, Subscription
    from apps.fleets.models import Fleet
    from apps.scheduling.models import Job

    _, globex_side = sides
    globex = globex_side.lb.org
    fleet = Fleet.objects.create(name="globex-only", region=RegionFactory(slug="eu-west"))
    LoadBalancer.objects.filter(pk=globex_side.lb.pk).update(fleet=fleet)  # a fleet acme has no LB on
    foreign = {LoadBalancer: globex_side.lb, Pool: globex_side.pool, Listener: globex_side.listener,
               Route: globex_side.route, CloudTarget: globex_side.target, Certificate: globex_side.cert,
               Fleet: fleet,
               CapacityTest: CapacityTest.objects.create(org=globex, name="t", listener=globex_side.listener,
                                                         steps=[10]),
               Job: Job.objects.create(org=globex, name="j", kind="noop", schedule_type="cron", cron="0 3 * * *"),
               Subscription: Subscription.objects.create(org=globex, name="s", url="https://globex.example/hook"),
               Event: Event.objects.create(org=globex, type="lb.created", object_type="lb", object_id="1")}
    shared = {Region}  # every org reads regions: a filter by one is no oracle
    checked = []
    for prefix, name, model in _choice_filters():
        obj = foreign.get(model)
        if obj is None:
            # A new filter by a tenant-owned model needs a foreign row here, or this test would skip it.
            assert model in shared, f"{prefix}?{name}: add a foreign {model.__name__} to this test"
            continue
        attacked = alice.client.get(f"/api/v1/{prefix}/", {name: obj.pk})
        absent = alice.client.get(f"/api/v1/{prefix}/", {name: MISSING_ID})
        assert _shape(attacked, obj.pk) == _shape(absent, MISSING_ID), (prefix, name)
        checked.append(f"{prefix}?{name}")
    assert {"listeners?lb", "pools?lb", "members?pool", "routes?lb", "capacity-tests?pool", "nodes?fleet",
            "capacity-runs?test", "job-runs?job", "event-deliveries?subscription",
            "event-deliveries?event"} <= set(checked), checked
