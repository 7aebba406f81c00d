"""A hostile tenant in the UI forms: another tenant's objects are never offered, and naming one anyway
answers exactly like naming a missing one (the UI twin of tests/core/test_hostile_references.py).

The last test walks every ServiceFormView of the UI and fails on a select input that is a writable relation
field of its serializer and has no case here (shared infrastructure and operator-only forms excepted), so a
new reference in a form needs an attack case before the suite passes.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
from django.urls import URLPattern, URLResolver, get_resolver, reverse

from apps.balancers.models import IpPool, Listener, LoadBalancer, StaticIP
from apps.core import crypto
from apps.core.service_forms import ServiceFormView
from apps.fleets.models import Certificate, Fleet
from tests.core.relationkit import writable_relations
from tests.factories import LoadBalancerFactory, PoolFactory, RegionFactory
from tests.fleets.fleetkit import self_signed
from tests.personas import HTMX, web

pytestmark = pytest.mark.django_db
MISSING_ID = 987_654_321


def _org_objects(org, n: int, ip_pool: IpPool) -> dict[str, Any]:
    lb = LoadBalancerFactory(name=f"{org.slug}-lb", org=org)
    pool = PoolFactory(lb=lb, org=org, name=f"{org.slug}-web")
    cert_pem, key_pem = self_signed(days=90, name=f"{org.slug}.example")
    cert = Certificate.objects.create(org=org, name=f"{org.slug}-cert", cert_pem=cert_pem,
                                      key_encrypted=crypto.encrypt(key_pem))
    ip = StaticIP.objects.create(pool=ip_pool, address=f"192.0.2.{n}", org=org, state=StaticIP.State.RESERVED)
    listener = Listener.objects.create(lb=lb, name="http", port=8000 + n)
    return {"lb": lb, "default_pool": pool, "certificate": cert, "static_ip": ip, "listener": listener}


@pytest.fixture
def sides(acme, globex):
    RegionFactory(slug="us-east")
    ip_pool = IpPool.objects.create(name="ips", cidr="192.0.2.0/28")
    return _org_objects(acme, 2, ip_pool), _org_objects(globex, 3, ip_pool)


# (url name, url args from acme's side, valid form data from acme's side, the field under attack)
Case = tuple[str, Callable[[dict], list[int]], Callable[[dict], dict[str, str]], str]
LISTENER_NEW = ("listener-new", lambda a: [a["lb"].pk],
                lambda a: {"name": "web", "protocol": "http", "port": "9443"})
LISTENER_EDIT = ("listener-edit", lambda a: [a["listener"].pk],
                 lambda a: {"name": "http", "protocol": "http", "port": str(a["listener"].port)})
HTTPS = {"protocol": "https"}
CASES: list[Case] = [
    (*LISTENER_NEW, "default_pool"),
    (LISTENER_NEW[0], LISTENER_NEW[1], lambda a: {**LISTENER_NEW[2](a), **HTTPS}, "certificate"),
    (*LISTENER_NEW, "static_ip"),
    (*LISTENER_EDIT, "default_pool"),
    (LISTENER_EDIT[0], LISTENER_EDIT[1], lambda a: {**LISTENER_EDIT[2](a), **HTTPS}, "certificate"),
    (*LISTENER_EDIT, "static_ip"),
]


def _options(html: str, field: str) -> set[str]:
    select = re.search(rf'<select[^>]*name="{field}"[^>]*>(.*?)</select>', html, flags=re.S)
    assert select, f"no select {field!r} in the form"
    return set(re.findall(r'<option[^>]*value="([^"]*)"', select.group(1)))


def _shape(response, field: str, sent: Any) -> tuple[int, str, str]:
    """Status, the field's error and the form's other errors, with the value sent blanked out (errors may
    echo it back); the rest of the page differs by its CSRF token."""
    html = response.content.decode()
    errors = [re.search(rf'id="{key}"[^>]*>(.*?)</p>', html, flags=re.S) for key in (f"f-{field}-err", "form-errors")]
    field_error, other = (re.sub(rf"\b{re.escape(str(sent))}\b", "<sent>", m.group(1)) if m else "" for m in errors)
    return response.status_code, field_error, other


@pytest.mark.parametrize("name,args,data,field", CASES, ids=[f"{c[0]}.{c[3]}" for c in CASES])
def test_a_form_offers_no_foreign_object_and_refuses_one_like_a_missing_one(sides, alice, name, args, data,
                                                                              field):
    ours, theirs = sides
    url = reverse(name, args=args(ours))
    client = web(alice)
    offered = _options(client.get(url).content.decode(), field)
    assert str(ours[field].pk) in offered  # the form does offer the tenant's own object
    assert str(theirs[field].pk) not in offered
    before = {m: list(m.objects.values()) for m in (Listener, StaticIP)}

    attacked = client.post(url, {**data(ours), field: str(theirs[field].pk)}, **HTMX)
    absent = client.post(url, {**data(ours), field: str(MISSING_ID)}, **HTMX)

    assert attacked.status_code == 422, attacked.content.decode()[:400]
    assert _shape(attacked, field, theirs[field].pk)[1], attacked.content.decode()  # said by its field
    assert _shape(attacked, field, theirs[field].pk) == _shape(absent, field, MISSING_ID)
    assert {m: list(m.objects.values()) for m in before} == before


def test_a_customer_cannot_forge_placement_org_or_shared_in_the_lb_form(sides, alice, globex):
    """The customer's LB form has no fleet, org or shared inputs; posting them anyway changes nothing."""
    ours, _ = sides
    fleet = Fleet.objects.create(name="edge-us", region=RegionFactory(slug="us-west"))
    forged = {"fleet": str(fleet.pk), "shared": "on", "org": globex.slug}
    client = web(alice)
    assert client.post(reverse("lb-new"), {"name": "forged", **forged}).status_code == 302
    assert client.post(reverse("lb-edit", args=[ours["lb"].pk]), {"name": ours["lb"].name, **forged}).status_code \
        == 302
    for lb in (LoadBalancer.objects.get(name="forged"), LoadBalancer.objects.get(pk=ours["lb"].pk)):
        assert (lb.org, lb.fleet_id, lb.shared) == (alice.org, None, False)


# Select inputs whose rows every org may reference (regions), and forms only operators reach.
SHARED = {"region", "src", "dst"}


def _form_views(resolver: URLResolver | None = None) -> list[tuple[str, type[ServiceFormView]]]:
    found = []
    for entry in (resolver or get_resolver()).url_patterns:
        if isinstance(entry, URLResolver):
            found += _form_views(entry)
        elif isinstance(entry, URLPattern):
            view = getattr(entry.callback, "view_class", None)
            if view is not None and issubclass(view, ServiceFormView):
                found.append((entry.name, view))
    return found


@pytest.mark.parametrize("field", ["lb", "target"])
def test_the_cloud_plan_form_offers_no_foreign_lb_or_target_and_refuses_one_like_a_missing_one(acme, globex, alice,
                                                                                               field):
    from apps.cloud.models import CloudApply, CloudTarget

    def side(org):
        lb = LoadBalancerFactory(name=f"{org.slug}-cloud", org=org, kind=LoadBalancer.Kind.GCP)
        target = CloudTarget.objects.create(org=org, name=f"{org.slug}-gcp", provider="gcp", project_or_account="p")
        return {"lb": lb, "target": target}

    ours, theirs = side(acme), side(globex)
    url = reverse("cloud-run-new")
    client = web(alice)
    offered = _options(client.get(url).content.decode(), field)
    assert str(ours[field].pk) in offered
    assert str(theirs[field].pk) not in offered
    data = {"lb": str(ours["lb"].pk), "target": str(ours["target"].pk)}

    attacked = client.post(url, {**data, field: str(theirs[field].pk)}, **HTMX)
    absent = client.post(url, {**data, field: str(MISSING_ID)}, **HTMX)

    assert attacked.status_code == 422, attacked.content.decode()[:400]
    assert _shape(attacked, field, theirs[field].pk)[1]
    assert _shape(attacked, field, theirs[field].pk) == _shape(absent, field, MISSING_ID)
    assert not CloudApply.objects.exists()


# Form inputs with an attack case of their own above (not in CASES).
COVERED_APART = {("cloud-run-new", "lb"), ("cloud-run-new", "target")}


def test_the_cases_cover_every_reference_a_customer_form_offers():
    covered = {(name, field) for name, _, _, field in CASES} | COVERED_APART
    walked, missing = set(), []
    for name, view in _form_views():
        if view.operator_only or view.serializer_class is None:
            continue
        relations = {where.rsplit(".", 1)[-1] for where, _ in writable_relations(view.serializer_class(), name)}
        for spec in view.fields:
            walked.add(name)
            if spec.kind == "select" and spec.name in relations and spec.name not in SHARED \
                    and (name, spec.name) not in covered:
                missing.append(f"{name}.{spec.name}")
    assert {"listener-new", "listener-edit", "pool-new", "member-new"} <= walked, walked
    assert not missing, f"no hostile-reference case for the form inputs {missing}: add one to CASES"
