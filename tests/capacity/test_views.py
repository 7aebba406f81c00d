"""The capacity UI through Django's test client: define, start, watch, apply, compare; tenancy 404s."""

from __future__ import annotations

import pytest

from apps.balancers.models import PoolRegion
from apps.capacity.models import CapacityRun, CapacityTest
from tests.capacity.capacitykit import knee_run
from tests.personas import web

pytestmark = pytest.mark.django_db



@pytest.fixture
def listener(world):
    return world.listener(8082)


@pytest.fixture
def test_obj(alice, listener, world) -> CapacityTest:
    response = alice.client.post("/api/v1/capacity-tests/", {
        "name": "web", "listener": listener.pk, "steps": [50, 100, 200], "step_duration_s": 2, "slo_p99_ms": 50,
        "pool": world.pool.pk, "region": "us-east"}, format="json")
    assert response.status_code == 201, response.content
    return CapacityTest.objects.get(pk=response.json()["id"])


def test_the_index_lists_tests_and_offers_the_form_with_own_and_shared_listeners(alice, test_obj, world):
    world.listener(9100, lb=world.globex_lb, name="globex-http")
    world.listener(9101, lb=world.edge, name="edge-http")
    page = web(alice).get("/capacity/").content.decode()
    assert f"/capacity/tests/{test_obj.pk}/" in page
    assert 'hx-post="/capacity/"' in page
    assert "edge/edge-http" in page and "acme-lb/http-8082" in page
    assert "globex-http" not in page


def test_defining_a_test_in_the_form_redirects_to_it(alice, listener):
    response = web(alice).post("/capacity/", {
        "name": "from-ui", "listener": listener.pk, "steps": "20:1, 40:1", "mode": "open", "slo_p99_ms": "100",
        "slo_error_rate": "0.01", "shards": "1", "safety_factor": "0.8", "path": "/"}, HTTP_HX_REQUEST="true")
    assert response.status_code == 200, response.content
    test = CapacityTest.objects.get(name="from-ui")
    assert response["HX-Redirect"] == f"/capacity/tests/{test.pk}/"
    assert test.steps == [[20.0, 1.0], [40.0, 1.0]]


def test_the_form_shows_a_refused_target_next_to_its_field(alice, world):
    foreign = world.listener(9102, lb=world.globex_lb)
    response = web(alice).post("/capacity/", {"name": "evil", "listener": foreign.pk, "steps": "10"},
                                       HTTP_HX_REQUEST="true")
    assert response.status_code == 422
    assert "not one of your organization" in response.content.decode()
    assert not CapacityTest.objects.filter(name="evil").exists()


def test_a_viewer_cannot_define_or_start(vera, test_obj, listener):
    client = web(vera)
    assert client.post("/capacity/", {"name": "v", "listener": listener.pk, "steps": "10"}).status_code == 403
    assert client.post(f"/capacity/tests/{test_obj.pk}/start/").status_code == 403
    assert "Start a run" not in client.get(f"/capacity/tests/{test_obj.pk}/").content.decode()


def test_starting_from_the_test_page_opens_the_runs_live_progress(alice, test_obj):
    client = web(alice)
    response = client.post(f"/capacity/tests/{test_obj.pk}/start/", HTTP_HX_REQUEST="true")
    run = CapacityRun.objects.get(test=test_obj)
    assert response["HX-Redirect"] == f"/capacity/runs/{run.pk}/"
    CapacityRun.objects.filter(pk=run.pk).update(status="running", progress_percent=37.5, current_step=1,
                                                 achieved_rate=101.3)
    page = client.get(f"/capacity/runs/{run.pk}/").content.decode()
    assert f'hx-get="/capacity/runs/{run.pk}/progress/?active=1"' in page and 'hx-trigger="every 1s"' in page
    assert '<progress id="run-progress-bar" max="100" value="37.5"' in page
    assert "step 2 of 3" in page and "101.3 req/s achieved" in page
    assert "Cancel run" in page
    cancelled = client.post(f"/capacity/runs/{run.pk}/cancel/", HTTP_HX_REQUEST="true").content.decode()
    assert "cancelled" in cancelled and "hx-trigger" not in cancelled


def test_the_poller_reloads_the_page_once_the_run_has_finished(alice, test_obj):
    run = knee_run(test_obj.pk)
    response = web(alice).get(f"/capacity/runs/{run.pk}/progress/?active=1", HTTP_HX_REQUEST="true")
    assert response["HX-Refresh"] == "true"


def test_a_finished_run_shows_chart_knee_and_applies_in_one_click(alice, test_obj, world):
    run = knee_run(test_obj.pk)
    client = web(alice)
    page = client.get(f"/capacity/runs/{run.pk}/").content.decode()
    assert f'data-capacity-chart="/capacity/runs/{run.pk}/chart.json"' in page
    assert 'class="capacity-knee"' in page and "39.6 req/s" in page and "Apply to the pool" in page
    chart = client.get(f"/capacity/runs/{run.pk}/chart.json").json()
    assert chart["knee_index"] == 1 and chart["p99_ms"][2] > chart["p99_ms"][1]
    applied = client.post(f"/capacity/runs/{run.pk}/apply/", HTTP_HX_REQUEST="true").content.decode()
    assert "applied" in applied
    assert PoolRegion.objects.get(pk=world.pool_region.pk).max_rate_per_member == 39.6


def test_two_runs_compare_side_by_side(alice, test_obj):
    a, b = knee_run(test_obj.pk), knee_run(test_obj.pk)
    page = web(alice).get(f"/capacity/compare/?run={a.pk}&run={b.pk}").content.decode()
    assert f"/capacity/runs/{a.pk}/chart.json,/capacity/runs/{b.pk}/chart.json" in page
    assert page.count("<tr><td>") == 3


def test_an_outsider_gets_404_on_every_capacity_page(charlie, test_obj):
    run = knee_run(test_obj.pk)
    client = web(charlie)
    for url in [f"/capacity/tests/{test_obj.pk}/", f"/capacity/runs/{run.pk}/", f"/capacity/runs/{run.pk}/chart.json",
                f"/capacity/runs/{run.pk}/progress/"]:
        assert client.get(url).status_code == 404, url
    for url in [f"/capacity/tests/{test_obj.pk}/start/", f"/capacity/runs/{run.pk}/cancel/",
                f"/capacity/runs/{run.pk}/apply/"]:
        assert client.post(url).status_code == 404, url
    assert client.get(f"/capacity/compare/?run={run.pk}&run={run.pk + 1}").status_code == 404
    assert "web" not in client.get("/capacity/").content.decode().split("<main")[1]
