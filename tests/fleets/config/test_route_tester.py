"""The route tester (API and workspace): which route, pool and region serve a request, and why."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.balancers.models import Route, RouteTarget
from apps.fleets import services

pytestmark = pytest.mark.django_db


def _ask(persona, lb, **query):
    return persona.client.get(f"/api/v1/load-balancers/{lb.pk}/route-test/", query)


def test_it_names_the_route_pool_and_region_and_says_why(shared, alice, acme) -> None:
    lb, pool = shared["lb"], shared["pools"]["acme"]
    api = Route.objects.create(lb=lb, org=acme, hosts=["acme.example.com"], path="/api", priority=50)
    RouteTarget.objects.create(route=api, pool=pool, weight=100)
    services.fleet_render(fleet=shared["fleet"])

    body = _ask(alice, lb, host="ACME.example.com:8080", path="/api/v1?x=1", method="POST").json()

    assert body["route"]["id"] == api.pk and body["pools"] == [{"id": pool.pk, "name": "acme-web",
                                                                 "weight_percent": 100.0}]
    assert "path /api/v1 is below the prefix /api/" in body["why"]
    assert "host acme.example.com is the route's host acme.example.com" in body["why"]
    assert body["also_matched"] == [Route.objects.get(org=acme, path="/").pk]
    [region] = body["regions"]
    assert region["region"] == "us-east" and region["pools"][0]["serves_from"] == "us-east"
    assert "fleet" not in region  # fleets are operator infrastructure

    apix = _ask(alice, lb, host="acme.example.com", path="/apix").json()
    assert apix["route"]["path"] == "/"  # never the /api route


def test_an_unknown_host_gets_the_listeners_no_route_answer(shared, alice) -> None:
    body = _ask(alice, shared["lb"], host="nobody.example.org", path="/").json()
    assert body["route"] is None and "no route matches this host and path" in body["why"]
    assert body["listeners"] == [{"id": body["listeners"][0]["id"], "name": "http", "port": 18080,
                                  "outcome": "no_route", "status": 404,
                                  "body": "No route for this host and path."}]


def test_another_tenants_route_is_named_only_as_such(shared, alice, otto) -> None:
    body = _ask(alice, shared["lb"], host="globex.example.com", path="/x").json()
    assert body["route"] == {"visible": False, "detail": "another tenant's route"}
    assert body["pools"] == [] and body["regions"] == [] and "globex-web" not in str(body)
    operator = _ask(otto, shared["lb"], host="globex.example.com", path="/x").json()
    assert operator["route"]["hosts"] == ["globex.example.com"]


def test_bad_input_is_a_coded_400(shared, alice) -> None:
    response = _ask(alice, shared["lb"], host="a b", path="nope")
    assert response.status_code == 400 and {"host", "path"} <= set(response.json()["fields"])


def test_the_workspace_form_answers_in_place(shared, alice) -> None:
    client = Client()
    client.force_login(alice.user)
    unrendered = client.get(f"/load-balancers/{shared['lb'].pk}/route-test/",
                            {"host": "acme.example.com", "path": "/"}).content.decode()
    assert "Region us-east: not rendered yet." in unrendered
    services.fleet_render(fleet=shared["fleet"])
    page = client.get(f"/load-balancers/{shared['lb'].pk}/").content.decode()
    assert 'hx-get="/load-balancers/{}/route-test/"'.format(shared["lb"].pk) in page
    partial = client.get(f"/load-balancers/{shared['lb'].pk}/route-test/",
                         {"host": "acme.example.com", "path": "/shop"}, HTTP_HX_REQUEST="true").content.decode()
    assert "the prefix / matches every path" in partial and "acme-web (100.0%)" in partial
    assert "served in <strong>us-east</strong>" in partial
