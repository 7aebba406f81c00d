"""An operator writing into a tenant's org names only rows that tenant may use.

The operator sees every row, so its relation fields resolve everywhere; what it writes *into acme* must
still only name acme's rows (or shared ones). For every case of the hostile-reference table, otto (ops)
sends acme's payload for acme with the reference swapped for globex's row, then for a missing id: both
are refused alike and nothing is written. Fields that choose the org the write lands in (`org`, a
listener's `lb`, a member's `pool`...) are the operator's to choose and are left out here.
"""

from __future__ import annotations

import copy

import pytest

from apps.balancers.models import Listener, LoadBalancer, Pool, Route, StaticIP
from apps.capacity.models import CapacityTest
from apps.fleets.models import Certificate
from tests.core.relationkit import CASES, make_sides, put_reference, response_shape

# endpoint → the field that decides the org the write lands in (the model's TENANT_PATH head).
TARGET_FIELD = {"load-balancers": "org", "listeners": "lb", "pools": "org", "pool-regions": "pool",
                "members": "pool", "routes": "org", "hostname-claims": "org", "static-ips": "org",
                "certificates": "org", "managed-certificates": "org", "capacity-tests": "org", "jobs": "org",
                "cloud-targets": "org", "cloud-applies": "target", "drills": "pool"}
@pytest.fixture
def sides(acme, globex, ops):
    return make_sides(acme, globex)


OPERATOR_CASES = [c for c in CASES if c[2] != TARGET_FIELD[c[0].split("/")[3]]]


def _for_acme(url: str, payload: dict) -> dict:
    """The payload, written into acme by name where the endpoint takes an org."""
    endpoint = url.split("/")[3]
    if TARGET_FIELD[endpoint] == "org":
        payload = {**payload, "org": "acme"}
    return payload


def test_the_table_still_covers_cases_for_the_operator():
    fields = {(c[0].split("/")[3], c[2]) for c in OPERATOR_CASES}
    assert {("routes", "lb"), ("routes", "targets.pool"), ("pools", "lb"), ("listeners", "certificate"),
            ("listeners", "static_ip"), ("listeners", "default_pool"), ("capacity-tests", "pool"),
            ("cloud-applies", "lb")} <= fields


@pytest.mark.parametrize("url,payload,field,foreign,missing", OPERATOR_CASES,
                         ids=[f"{c[0].split('/')[3]}.{c[2]}" for c in OPERATOR_CASES])
def test_an_operator_writing_for_a_tenant_cannot_name_another_tenants_row(sides, otto, url, payload, field,
                                                                           foreign, missing):
    acme_side, globex_side = sides
    models = (LoadBalancer, Listener, Pool, Route, CapacityTest, StaticIP, Certificate)
    before = {m: m.objects.count() for m in models}

    attacked = otto.client.post(url, put_reference(_for_acme(url, payload(acme_side)), field, foreign(globex_side)),
                                format="json")
    absent = otto.client.post(url, put_reference(_for_acme(url, payload(acme_side)), field, missing), format="json")

    assert attacked.status_code in (400, 404, 422), attacked.content
    assert response_shape(attacked, foreign(globex_side)) == response_shape(absent, missing)
    assert {m: m.objects.count() for m in models} == before


def test_the_same_payload_with_acmes_own_row_is_accepted_for_the_operator(sides, otto):
    """The check refuses the foreign row, not the operator acting for acme."""
    acme_side, _ = sides
    created = otto.client.post("/api/v1/routes/", {"org": "acme", "lb": acme_side.lb.pk, "path": "/ops-made",
                                                   "priority": 1, "targets": [{"pool": acme_side.pool.pk}]},
                               format="json")
    assert created.status_code == 201, created.content
    assert Route.objects.get(pk=created.json()["id"]).org.slug == "acme"


def test_an_operator_update_of_a_tenants_listener_cannot_default_to_another_tenants_pool(sides, otto):
    acme_side, globex_side = sides
    response = otto.client.patch(f"/api/v1/listeners/{acme_side.listener.pk}/",
                                 {"default_pool": globex_side.pool.pk}, format="json")
    assert response.status_code == 400 and response.json()["fields"]["default_pool"][0].startswith("Invalid pk")
    acme_side.listener.refresh_from_db()
    assert acme_side.listener.default_pool_id is None


# --- config as code: the operator applies acme's document ----------------------------------------------


def _export(persona, org: str) -> dict:
    response = persona.client.get("/api/v1/export/", {"org": org})
    assert response.status_code == 200, response.content
    return response.json()


def _apply(persona, org: str, doc: dict):
    return persona.client.post(f"/api/v1/apply/?org={org}", {"document": doc}, format="json",
                               HTTP_IF_MATCH=doc["etag"])


@pytest.mark.parametrize("kind", ["listeners", "pools", "routes", "members"])
def test_an_operator_applying_acmes_file_cannot_write_onto_globexs_private_lb(sides, otto, kind):
    _, globex_side = sides
    doc = _export(otto, "acme")
    edited = copy.deepcopy(doc)
    g_lb, g_pool = globex_side.lb.name, globex_side.pool.name
    row = {"listeners": {"lb": g_lb, "name": "sneaky", "protocol": "http", "port": 9999},
           "pools": {"lb": g_lb, "name": "sneaky"},
           "routes": {"lb": g_lb, "priority": 777, "path": "/sneaky", "path_match": "prefix", "hosts": [],
                      "redirect_url": "", "targets": [{"pool": g_pool, "weight": 100}]},
           "members": {"lb": g_lb, "pool": g_pool, "name": "sneaky", "region": "us-east", "address": "192.0.2.77",
                       "port": 80, "weight": 100, "admin_state": "active"}}[kind]
    edited[kind].append(row)
    before = {m: m.objects.filter(lb=globex_side.lb).count() for m in (Listener, Pool, Route)}

    response = _apply(otto, "acme", edited)
    assert response.status_code in (400, 404), response.content
    assert response.json()["code"] in ("unknown_reference", "apply_refused"), response.content
    assert {m: m.objects.filter(lb=globex_side.lb).count() for m in (Listener, Pool, Route)} == before
    assert not globex_side.pool.members.filter(name="sneaky").exists()


def test_an_operator_applying_acmes_file_picks_acmes_certificate_not_globexs_of_the_same_name(sides, otto):
    acme_side, globex_side = sides
    Certificate.objects.filter(pk=globex_side.cert.pk).update(name="shared-name")
    Certificate.objects.filter(pk=acme_side.cert.pk).update(name="shared-name-acme")
    doc = _export(otto, "acme")
    edited = copy.deepcopy(doc)
    edited["listeners"].append({"lb": acme_side.lb.name, "name": "tls", "protocol": "https", "port": 9443,
                                "certificate": "shared-name"})  # globex's name: not acme's to use
    refused = _apply(otto, "acme", edited)
    assert refused.status_code == 400 and refused.json()["code"] == "unknown_reference", refused.content
    assert not Listener.objects.filter(name="tls").exists()

    edited["listeners"][-1]["certificate"] = "shared-name-acme"
    applied = _apply(otto, "acme", edited)
    assert applied.status_code == 200, applied.content
    assert Listener.objects.get(name="tls").certificate_id == acme_side.cert.pk


def test_every_serializer_that_writes_a_reference_checks_it_in_the_target_orgs_scope():
    """The one place: a new endpoint whose body names rows inherits the check, or this test names it."""
    from apps.core.api.fields import ActingForMixin
    from tests.core.relationkit import serializer_classes, writable_relations

    writing = {(prefix, cls) for prefix, cls in serializer_classes() if any(writable_relations(cls(), prefix))}
    assert len(writing) > 10, writing
    unchecked = sorted(f"{prefix}:{cls.__name__}" for prefix, cls in writing if not issubclass(cls, ActingForMixin))
    assert not unchecked, f"derive these from TenantModelSerializer or StrictSerializer: {unchecked}"
