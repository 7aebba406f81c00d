"""GET /fleets/{id}/health/ answers the documented FleetHealth body, from the hot cache and from the
database rows; customers (owner or outsider of the LBs on it) find no fleet there."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.utils import timezone

from apps.fleets.health.collect import health_cache_key
from apps.fleets.models import Node, NodeHealth
from tests.openapi_check import assert_matches_schema

pytestmark = pytest.mark.django_db

PATH = "/api/v1/fleets/{id}/health/"


@pytest.fixture
def fleet(shared):
    fleet = shared["fleet"]
    node = Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir="/run/spw/n1",
                               config_dir="/etc/spw/n1")
    now = timezone.now()
    NodeHealth.objects.create(node=node, proxy="be_1", server="m1", status="UP", check_status="L7OK", weight=1,
                              rate_per_s=3, updated_at=now)
    NodeHealth.objects.create(node=node, proxy="be_1", server="BACKEND", status="UP", updated_at=now)
    NodeHealth.objects.create(node=node, proxy="be_2", server="m2", status="DOWN", check_status="",
                              weight=None, rate_per_s=None, updated_at=now)
    cache.delete(health_cache_key(fleet.pk))
    yield fleet
    cache.delete(health_cache_key(fleet.pk))


def test_health_from_the_database_rows_matches_the_schema(fleet, otto) -> None:
    response = otto.client.get(f"/api/v1/fleets/{fleet.pk}/health/")
    assert response.status_code == 200
    assert_matches_schema("get", PATH, response)
    body = response.json()
    assert body["collected_at"] is None
    assert [s["server"] for s in body["nodes"]["n1"]["servers"]] == ["m1", "m2"]  # no BACKEND summary row


def test_health_from_the_hot_cache_matches_the_schema(fleet, otto) -> None:
    cache.set(health_cache_key(fleet.pk), {
        "collected_at": timezone.now().isoformat(),
        "nodes": {"n1": {"reachable": True, "servers": [{"backend": "be_1", "server": "m1", "status": "UP",
                                                         "check": "L7OK", "weight": 1, "rate": 0}]},
                  "n2": {"reachable": False, "error": "connection refused"}}}, 60)
    response = otto.client.get(f"/api/v1/fleets/{fleet.pk}/health/")
    assert response.status_code == 200
    assert_matches_schema("get", PATH, response)
    assert response.json()["nodes"]["n2"] == {"reachable": False, "error": "connection refused"}


def test_customers_find_no_fleet_health(fleet, alice, charlie) -> None:
    for persona in (alice, charlie):  # acme has a pool on the shared LB there; globex too
        response = persona.client.get(f"/api/v1/fleets/{fleet.pk}/health/")
        assert response.status_code == 404 and response.json()["code"] == "not_found"
