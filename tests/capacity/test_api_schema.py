"""Capacity run progress, results and chart answer exactly what the OpenAPI document says (their own
serializers, not the run's), for a running and a finished run, read by the owner, a viewer and an operator."""

from __future__ import annotations

import pytest

from apps.capacity.models import CapacityRun, CapacityShard, CapacityTest
from tests.capacity.capacitykit import RUNS, TESTS, knee_run
from tests.openapi_check import assert_matches_schema

pytestmark = pytest.mark.django_db

ACTIONS = ["progress", "results", "chart"]


@pytest.fixture
def runs(alice, world) -> list[CapacityRun]:
    response = alice.client.post(TESTS, {"name": "web-knee", "listener": world.listener(8081).pk,
                                         "steps": [50, 100, 200], "step_duration_s": 2, "slo_p99_ms": 50,
                                         "pool": world.pool.pk, "region": "us-east"}, format="json")
    assert response.status_code == 201, response.content
    test_id = response.json()["id"]
    test = CapacityTest.objects.get(pk=test_id)
    running = CapacityRun.objects.create(test=test, status=CapacityRun.Status.RUNNING, shards_total=1, step_count=3)
    CapacityShard.objects.create(run=running, index=0, status=CapacityShard.Status.RUNNING, start_skew_s=None)
    return [running, knee_run(test_id)]


@pytest.mark.parametrize("action", ACTIONS)
def test_run_actions_answer_their_documented_body(runs, action, alice, vera, otto) -> None:
    for run in runs:
        for persona in (alice, vera, otto):
            response = persona.client.get(f"{RUNS}{run.pk}/{action}/")
            assert response.status_code == 200
            assert_matches_schema("get", f"/api/v1/capacity-runs/{{id}}/{action}/", response)


def test_the_documented_bodies_are_not_the_run_object(runs) -> None:
    from tests.openapi_check import _document

    ops = _document()["paths"]
    refs = {a: ops[f"/api/v1/capacity-runs/{{id}}/{a}/"]["get"]["responses"]["200"]["content"]["application/json"]
            ["schema"]["$ref"].rsplit("/", 1)[1] for a in ACTIONS}
    assert refs == {"progress": "RunProgress", "results": "RunResults", "chart": "RunChart"}


def test_an_outsider_gets_404_for_every_run_action(runs, charlie) -> None:
    for run in runs:
        for action in ACTIONS:
            response = charlie.client.get(f"{RUNS}{run.pk}/{action}/")
            assert response.status_code == 404 and response.json()["code"] == "not_found"
