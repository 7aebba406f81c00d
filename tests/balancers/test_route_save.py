"""services.route_save answers and audits a route's targets from the rows it has just written: the answer, the
audit record and a later read agree, in the model's order (pool), and no target row is read back under the LB's
lock (its holder's time is the LB's whole write rate)."""

from __future__ import annotations

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from apps.audit.models import AuditEvent
from apps.balancers.models import Route
from tests.factories import PoolFactory

pytestmark = pytest.mark.django_db


def _target_reads(queries) -> list[str]:
    return [q["sql"] for q in queries if q["sql"].startswith("SELECT") and '"balancers_routetarget"' in q["sql"]]


def _stored(route_id: int) -> list[dict]:
    route = Route.objects.get(pk=route_id)
    return [{"pool": t.pool_id, "weight": t.weight} for t in route.targets.all()]


def test_a_create_answers_and_audits_the_targets_it_wrote_without_reading_them_back(world, alice):
    canary = PoolFactory(lb=world.acme_lb, org=alice.org, name="web-canary")
    body = {"lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/split", "priority": 7,
            # Sent in the reverse of the model's order: the answer is in pool order, as a read of them is.
            "targets": [{"pool": canary.pk, "weight": 10}, {"pool": world.acme_pool.pk, "weight": 90}]}
    with CaptureQueriesContext(connection) as queries:
        created = alice.client.post("/api/v1/routes/", body, format="json")
    assert created.status_code == 201, created.content
    stored = _stored(created.json()["id"])
    assert stored == sorted(body["targets"], key=lambda t: t["pool"])
    assert created.json()["targets"] == stored
    assert AuditEvent.objects.get(action="route.create", object_id=str(created.json()["id"])).after["targets"] == stored
    assert _target_reads(queries.captured_queries) == []


def test_an_update_answers_the_new_targets_and_a_partial_one_keeps_them(world, alice):
    canary = PoolFactory(lb=world.acme_lb, org=alice.org, name="web-canary")
    created = alice.client.post("/api/v1/routes/", {
        "lb": world.acme_lb.pk, "hosts": ["acme.example.com"], "path": "/move", "priority": 8,
        "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}, format="json").json()
    moved = alice.client.patch(f"/api/v1/routes/{created['id']}/", {
        "targets": [{"pool": canary.pk, "weight": 1}]}, format="json")
    assert moved.status_code == 200, moved.content
    assert moved.json()["targets"] == _stored(created["id"]) == [{"pool": canary.pk, "weight": 1}]
    event = AuditEvent.objects.get(action="route.update", object_id=str(created["id"]))
    assert event.before["targets"] == [{"pool": world.acme_pool.pk, "weight": 100}]
    assert event.after["targets"] == [{"pool": canary.pk, "weight": 1}]
    renamed = alice.client.patch(f"/api/v1/routes/{created['id']}/", {"path": "/moved"}, format="json")
    assert renamed.status_code == 200, renamed.content
    assert renamed.json()["targets"] == _stored(created["id"]) == [{"pool": canary.pk, "weight": 1}]
