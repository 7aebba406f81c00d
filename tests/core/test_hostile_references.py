"""A hostile tenant puts another tenant's id in every reference it can write.

For each writable reference of the API (relation fields and the plain-id references the services
resolve), acme's owner sends a valid payload with one reference swapped for one of globex's objects,
then for an id that does not exist. Both must be refused, with the same status and the same code, and
nothing must be created. The last test checks that the cases (`CASES`, tests/core/relationkit.py, which also walks
the serializers) cover every writable relation field the serializers have, so a new field needs an attack case
there before the suite passes.
"""

from __future__ import annotations

import pytest

from apps.balancers.models import Listener, LoadBalancer, Pool, Route, StaticIP
from apps.capacity.models import CapacityTest
from apps.cloud.models import CloudTarget
from apps.fleets.models import Certificate
from tests.core.relationkit import CASES, MISSING_ID, all_writable_relations, make_sides, put_reference, response_shape
from tests.factories import (
    RegionFactory,
)

# Writable relation fields whose rows are shared infrastructure: every org may reference them.
SHARED = {"region", "src", "dst", "static-ips.pool"}
# Fields only operators may set (placement): tested in test_a_customer_cannot_place_or_share_its_lb.
OPERATOR_FIELDS = {"load-balancers.fleet"}
# Endpoints only operators may write: a customer's POST is refused before any field is read.
OPERATOR_ENDPOINTS = ["region-distances", "ip-pools", "fleets", "nodes", "rollouts", "capacity-allowlist",
                      "cloud-credentials"]


@pytest.fixture
def sides(acme, globex, ops):
    return make_sides(acme, globex)


@pytest.mark.parametrize("url,payload,field,foreign,missing", CASES,
                         ids=[f"{c[0].split('/')[3]}.{c[2]}" for c in CASES])
def test_a_foreign_reference_answers_like_a_missing_one(sides, alice, url, payload, field, foreign, missing):
    acme_side, globex_side = sides
    before = {m: m.objects.count() for m in (LoadBalancer, Listener, Pool, Route, CapacityTest, StaticIP)}

    attacked = alice.client.post(url, put_reference(payload(acme_side), field, foreign(globex_side)), format="json")
    absent = alice.client.post(url, put_reference(payload(acme_side), field, missing), format="json")

    assert attacked.status_code in (400, 404, 422), attacked.content
    assert response_shape(attacked, foreign(globex_side)) == response_shape(absent, missing)
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
        assert response_shape(attacked, obj.pk) == response_shape(absent, MISSING_ID), (prefix, name)
        checked.append(f"{prefix}?{name}")
    assert {"listeners?lb", "pools?lb", "members?pool", "routes?lb", "capacity-tests?pool", "nodes?fleet",
            "capacity-runs?test", "job-runs?job", "event-deliveries?subscription",
            "event-deliveries?event"} <= set(checked), checked
