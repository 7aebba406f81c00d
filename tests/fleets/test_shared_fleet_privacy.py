"""On a shared fleet a customer sees what it needs (its LBs, how the nodes fare) and not the rest: other
tenants' LB names, the operator's node names, other tenants' server counts — on the pages and in the API."""

from __future__ import annotations

import pytest
from django.core.cache import cache
from django.test import Client

from apps.balancers.models import LoadBalancer
from apps.fleets.health.collect import health_cache_key
from apps.fleets.models import Node

pytestmark = pytest.mark.django_db

NODE = "edge-fra-7"


@pytest.fixture
def fleet(shared, globex):
    fleet = shared["fleet"]
    Node.objects.create(fleet=fleet, name=NODE, address="127.0.0.1", runtime_dir="/run/spw/n1",
                        config_dir="/etc/spw/n1")
    LoadBalancer.objects.create(org=globex, name="globex-secret-lb", fleet=fleet)
    cache.set(health_cache_key(fleet.pk), {"collected_at": None, "nodes": {NODE: {"reachable": True, "servers": [
        {"backend": "be_globex", "server": "m1", "status": "UP", "check": "", "weight": 1, "rate": 0}] * 7}}}, 60)
    yield fleet
    cache.delete(health_cache_key(fleet.pk))


def _page(persona, path: str) -> str:
    client = Client()
    client.force_login(persona.user)
    response = client.get(path)
    assert response.status_code == 200
    return response.content.decode()


def test_a_customer_sees_neither_other_tenants_lbs_nor_node_names_nor_server_counts(fleet, alice, charlie) -> None:
    for persona in (alice, charlie):
        listing = _page(persona, "/fleets/")
        detail = _page(persona, f"/fleets/{fleet.pk}/")
        assert "edge" in listing  # the shared LB it has pools on
        assert NODE not in listing + detail and "node 1" in detail
        assert "7/7" not in detail
    assert "globex-secret-lb" not in _page(alice, "/fleets/")
    assert "globex-secret-lb" in _page(charlie, "/fleets/")  # its own


def test_the_operator_sees_everything(fleet, otto) -> None:
    listing, detail = _page(otto, "/fleets/"), _page(otto, f"/fleets/{fleet.pk}/")
    assert "globex-secret-lb" in listing and NODE in detail and "7/7" in detail


def test_the_applied_answer_names_no_node_to_a_customer(shared, fleet, alice, otto) -> None:
    lb = shared["lb"]
    url = f"/api/v1/load-balancers/{lb.pk}/applied/?revision={lb.revision + 1}&timeout=0"
    customer = alice.client.get(url).json()["nodes"]
    assert [n["node"] for n in customer] == ["node 1"] and NODE not in str(customer)
    assert [n["node"] for n in otto.client.get(url).json()["nodes"]] == [NODE]


def test_a_customer_sees_rollout_progress_by_node_position(edge_rollout, alice, otto) -> None:
    page = _page(alice, f"/fleets/rollouts/{edge_rollout.pk}/")
    assert NODE not in page and "node 1" in page
    assert NODE in _page(otto, f"/fleets/rollouts/{edge_rollout.pk}/")


@pytest.fixture
def edge_rollout(fleet):
    from apps.fleets.models import ConfigRevision, NodeResult, Rollout

    revision = ConfigRevision.objects.create(fleet=fleet, number=1, text="x", sha256="0" * 64)
    rollout = Rollout.objects.create(fleet=fleet, revision=revision, status="succeeded")
    NodeResult.objects.create(rollout=rollout, node=Node.objects.get(name=NODE), status="succeeded")
    return rollout
