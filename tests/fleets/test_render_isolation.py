"""One tenant's broken object never blocks another tenant's deploys on a shared fleet.

GIVEN the shared LB `edge` (acme's and globex's routes and pools on one fleet) and globex's route left
pointing at a pool that is no longer on the LB (the old hole: PATCH /pools/{id} {lb} moved it), WHEN the
fleet renders, THEN the revision is valid, carries acme's route, leaves globex's route out and names it
as a problem — shown to globex, never to acme.
"""

from __future__ import annotations

import pytest

from apps.balancers.models import LoadBalancer, Pool, Route, RouteTarget
from apps.fleets import services
from apps.fleets.models import ConfigRevision

pytestmark = [pytest.mark.django_db, pytest.mark.haproxy]


def test_a_pool_cannot_be_moved_to_another_lb(shared, alice) -> None:
    own_lb = LoadBalancer.objects.create(org=alice.org, name="acme-own")
    pool = shared["pools"]["acme"]

    response = alice.client.patch(f"/api/v1/pools/{pool.pk}/", {"lb": own_lb.pk}, format="json")

    assert response.status_code == 400 and response.json()["code"] == "immutable"
    assert list(response.json()["fields"]) == ["lb"]
    pool.refresh_from_db()
    assert pool.lb_id == shared["lb"].pk


def _strand_globex_route(shared) -> Route:
    """What the old API allowed: globex's pool moved off the shared LB while its route still targets it."""
    elsewhere = LoadBalancer.objects.create(org=shared["pools"]["globex"].org, name="globex-own")
    Pool.objects.filter(pk=shared["pools"]["globex"].pk).update(lb=elsewhere)
    return RouteTarget.objects.get(pool=shared["pools"]["globex"]).route


def test_a_stranded_route_is_left_out_and_the_rest_still_renders(shared, alice) -> None:
    stranded = _strand_globex_route(shared)
    acme_route = Route.objects.get(lb=shared["lb"], org=alice.org)

    revision = services.fleet_render(fleet=shared["fleet"], reason="test")

    assert revision.validation_ok, revision.validation_output
    assert "acme.example.com" in str(revision.snapshot) and "globex.example.com" not in str(revision.snapshot)
    assert [(p["kind"], p["id"], p["code"]) for p in revision.problems] == [("route", stranded.pk, "unknown_pool")]
    assert acme_route.pk not in {p["id"] for p in revision.problems}
    # The next change of another tenant deploys: a new revision, valid.
    Route.objects.filter(pk=acme_route.pk).update(path="/shop")
    assert services.fleet_render(fleet=shared["fleet"], reason="test").validation_ok
    assert ConfigRevision.objects.filter(fleet=shared["fleet"], validation_ok=False).count() == 0


def test_each_tenant_sees_only_its_own_render_problems(shared, alice, charlie, otto) -> None:
    stranded = _strand_globex_route(shared)
    url = f"/api/v1/load-balancers/{shared['lb'].pk}/preview/"

    as_acme = alice.client.post(url, {}, format="json")
    as_globex = charlie.client.post(url, {}, format="json")
    as_operator = otto.client.post(url, {}, format="json")

    assert as_acme.status_code == as_globex.status_code == 200, as_acme.content
    assert all(entry["left_out"] == [] for entry in as_acme.json()["fleets"])
    assert str(stranded.pk) not in str(as_acme.json()["fleets"][0]["left_out"])
    assert [(p["kind"], p["id"]) for e in as_globex.json()["fleets"] for p in e["left_out"]] == [
        ("route", stranded.pk)]
    assert [(p["kind"], p["id"]) for e in as_operator.json()["fleets"] for p in e["left_out"]] == [
        ("route", stranded.pk)]


def test_an_https_listener_needs_a_certificate_and_a_free_port(shared, otto) -> None:
    lb = shared["lb"]
    no_cert = otto.client.post("/api/v1/listeners/", {"lb": lb.pk, "name": "tls", "port": 18443,
                                                      "protocol": "https"}, format="json")
    other = LoadBalancer.objects.create(org=lb.org, name="edge-two", fleet=shared["fleet"])
    taken = otto.client.post("/api/v1/listeners/", {"lb": other.pk, "name": "http", "port": 18080}, format="json")

    assert no_cert.status_code == 400 and no_cert.json()["code"] == "certificate_required"
    assert taken.status_code == 409 and taken.json()["code"] == "port_in_use"
    assert "edge" not in taken.json()["detail"]


def test_the_owner_sees_what_was_left_out_in_the_workspace_and_nobody_else_does(shared, alice, charlie) -> None:
    from django.test import Client

    from apps.fleets.models import Fleet

    stranded = _strand_globex_route(shared)
    revision = services.fleet_render(fleet=shared["fleet"], reason="test")
    Fleet.objects.filter(pk=shared["fleet"].pk).update(desired_revision=revision.number)

    pages = {}
    for persona in (alice, charlie):
        client = Client()
        client.force_login(persona.user)
        pages[persona.org.slug] = client.get(f"/load-balancers/{shared['lb'].pk}/deploy/").content.decode()

    assert f"route {stranded.pk}" in pages["globex"] and "unknown_pool" in pages["globex"]
    assert "data-left-out" not in pages["acme"] and f"route {stranded.pk}" not in pages["acme"]
