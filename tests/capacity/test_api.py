"""The capacity API: tenancy, CRUD, start/cancel/progress/results/apply, the allowlist.

Runs here never reach a worker (non-transactional tests: the enqueue waits for a commit that never
comes); finished runs are built from engine StepResults and merged by the same finalize code the
last shard calls, so knee, recommendation and apply are exercised without sending load.
"""

from __future__ import annotations

import pytest

from apps.audit.models import AuditEvent
from apps.balancers.models import LoadBalancer, PoolRegion
from apps.capacity import execution
from apps.capacity.models import CapacityRun, CapacityShard, CapacityTest, StepResult, TargetAllowlist
from tests.capacity.capacitykit import RUNS, TESTS, finished_run, knee_run, step_result

pytestmark = pytest.mark.django_db

@pytest.fixture
def listener(world):
    return world.listener(8081)


@pytest.fixture
def capacity_test_pk(alice, listener, world) -> int:
    response = alice.client.post(TESTS, {"name": "web-knee", "listener": listener.pk, "steps": [50, 100, 200],
                                         "step_duration_s": 2, "slo_p99_ms": 50, "pool": world.pool.pk,
                                         "region": "us-east"}, format="json")
    assert response.status_code == 201, response.content
    return response.json()["id"]


# --- tenancy ---------------------------------------------------------------------------------


def test_anonymous_callers_get_401(anon, capacity_test_pk):
    for url in [TESTS, f"{TESTS}{capacity_test_pk}/", RUNS]:
        response = anon.get(url)
        assert response.status_code == 401
        assert response.json()["code"] == "not_authenticated"


def test_a_viewer_reads_but_cannot_define_start_cancel_or_apply(vera, capacity_test_pk, listener):
    run = knee_run(capacity_test_pk)
    assert vera.client.get(f"{TESTS}{capacity_test_pk}/").status_code == 200
    assert vera.client.get(f"{RUNS}{run.pk}/progress/").status_code == 200
    for method, url, body in [("post", TESTS, {"name": "v", "listener": listener.pk, "steps": [10]}),
                              ("patch", f"{TESTS}{capacity_test_pk}/", {"slo_p99_ms": 10}),
                              ("delete", f"{TESTS}{capacity_test_pk}/", None),
                              ("post", f"{TESTS}{capacity_test_pk}/start/", None),
                              ("post", f"{RUNS}{run.pk}/cancel/", None),
                              ("post", f"{RUNS}{run.pk}/apply/", None)]:
        response = getattr(vera.client, method)(url, body, format="json")
        assert response.status_code == 403, (method, url)
        assert response.json()["code"] == "permission_denied"
    assert not CapacityRun.objects.exclude(pk=run.pk).exists()


def test_an_outsider_gets_404_for_everything_of_acmes(charlie, capacity_test_pk):
    run = knee_run(capacity_test_pk)
    for method, url in [("get", f"{TESTS}{capacity_test_pk}/"), ("patch", f"{TESTS}{capacity_test_pk}/"),
                        ("delete", f"{TESTS}{capacity_test_pk}/"), ("post", f"{TESTS}{capacity_test_pk}/start/"),
                        ("get", f"{RUNS}{run.pk}/"), ("get", f"{RUNS}{run.pk}/progress/"),
                        ("get", f"{RUNS}{run.pk}/results/"), ("get", f"{RUNS}{run.pk}/chart/"),
                        ("post", f"{RUNS}{run.pk}/cancel/"), ("post", f"{RUNS}{run.pk}/apply/")]:
        response = getattr(charlie.client, method)(url, {}, format="json")
        assert response.status_code == 404, (method, url)
        assert response.json()["code"] == "not_found"
    assert charlie.client.get(TESTS).json()["count"] == 0
    assert charlie.client.get(RUNS).json()["count"] == 0


def test_an_operator_sees_every_orgs_tests_and_runs(otto, capacity_test_pk):
    run = knee_run(capacity_test_pk)
    assert capacity_test_pk in [t["id"] for t in otto.client.get(TESTS).json()["results"]]
    assert run.pk in [r["id"] for r in otto.client.get(RUNS).json()["results"]]


# --- tests CRUD --------------------------------------------------------------------------------


def test_the_owner_defines_reads_updates_and_deletes_a_test(alice, capacity_test_pk):
    fetched = alice.client.get(f"{TESTS}{capacity_test_pk}/")
    assert fetched.status_code == 200 and fetched["ETag"]
    body = fetched.json()
    assert body["org"] == "acme"
    assert body["steps"] == [[50.0, 2.0], [100.0, 2.0], [200.0, 2.0]]  # bare numbers take step_duration_s
    assert body["mode"] == "open" and body["shards"] == 1 and body["created_by"].startswith("token:")
    stale = alice.client.patch(f"{TESTS}{capacity_test_pk}/", {"shards": 2}, format="json", HTTP_IF_MATCH='"stale"')
    assert stale.status_code == 412
    patched = alice.client.patch(f"{TESTS}{capacity_test_pk}/", {"steps": [[20, 1], [40, 1]], "shards": 2},
                                 format="json", HTTP_IF_MATCH=fetched["ETag"])
    assert patched.status_code == 200, patched.content
    assert patched.json()["steps"] == [[20.0, 1.0], [40.0, 1.0]] and patched.json()["shards"] == 2
    assert AuditEvent.objects.filter(action="capacitytest.update", object_id=str(capacity_test_pk)).exists()
    assert alice.client.delete(f"{TESTS}{capacity_test_pk}/").status_code == 204
    assert alice.client.get(f"{TESTS}{capacity_test_pk}/").status_code == 404


def test_test_names_are_unique_per_org(alice, listener, capacity_test_pk):
    response = alice.client.post(TESTS, {"name": "web-knee", "listener": listener.pk, "steps": [10]}, format="json")
    assert response.status_code == 409
    assert response.json()["code"] == "name_taken"


@pytest.mark.parametrize(("fields", "code"), [
    ({"steps": []}, "invalid_steps"),
    ({"steps": [[10, 0]]}, "invalid_steps"),
    ({"steps": [[-5, 1]]}, "invalid_steps"),
    ({"steps": [["x", 1]]}, "invalid_steps"),
    ({"mode": "closed", "steps": [[2.5, 1]]}, "invalid_steps"),
    ({"path": "/a b"}, "invalid_path"),
    ({"hostname": "a.example.com\r\nX-Evil: 1"}, "invalid_hostname"),
    ({"hostname": "*.acme.test"}, "invalid_hostname"),
    ({"shards": 17}, "max_value"),
    ({"listener": None, "address": "evil host\r\nX: 1", "port": 80}, "invalid_hostname"),
])
def test_invalid_tests_are_refused_with_a_code(alice, listener, fields, code):
    body = {"name": "bad", "listener": listener.pk, "steps": [10], **fields}
    response = alice.client.post(TESTS, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["code"] == code, response.json()


def test_a_foreign_pool_cannot_receive_the_recommendation(alice, charlie, globex, listener):
    from tests.factories import PoolFactory

    foreign_pool = PoolFactory(lb=LoadBalancer.objects.get(name="globex-lb"), org=globex)
    response = alice.client.post(TESTS, {"name": "p", "listener": listener.pk, "steps": [10],
                                         "pool": foreign_pool.pk}, format="json")
    assert response.status_code == 400
    assert "pool" in response.json()["fields"]


# --- runs --------------------------------------------------------------------------------------


def test_start_creates_a_pending_run_and_an_idempotency_key_replays_it(alice, capacity_test_pk):
    first = alice.client.post(f"{TESTS}{capacity_test_pk}/start/", HTTP_IDEMPOTENCY_KEY="start-1")
    assert first.status_code == 201, first.content
    run = first.json()
    assert run["status"] == "pending" and run["test"] == capacity_test_pk and run["step_count"] == 3
    assert first["Location"] == f"{RUNS}{run['id']}/"
    again = alice.client.post(f"{TESTS}{capacity_test_pk}/start/", HTTP_IDEMPOTENCY_KEY="start-1")
    assert again.status_code == 201 and again.json()["id"] == run["id"]
    assert again["Idempotent-Replayed"] == "true"
    assert CapacityRun.objects.count() == 1
    assert AuditEvent.objects.filter(action="capacityrun.start").count() == 1


def test_runs_are_not_created_directly(alice, capacity_test_pk):
    response = alice.client.post(RUNS, {"test": capacity_test_pk}, format="json")
    assert response.status_code == 405


def test_cancel_a_pending_run_then_cancelling_again_conflicts(alice, capacity_test_pk):
    run_id = alice.client.post(f"{TESTS}{capacity_test_pk}/start/").json()["id"]
    cancelled = alice.client.post(f"{RUNS}{run_id}/cancel/")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    again = alice.client.post(f"{RUNS}{run_id}/cancel/")
    assert again.status_code == 409 and again.json()["code"] == "run_finished"
    # The start task, should it still arrive, leaves a cancelled run alone.
    assert execution.run_prepare(run_id, lambda *a: pytest.fail("no shard may be enqueued")) == "skipped"


def test_a_test_with_an_active_run_cannot_be_deleted(alice, capacity_test_pk):
    alice.client.post(f"{TESTS}{capacity_test_pk}/start/")
    response = alice.client.delete(f"{TESTS}{capacity_test_pk}/")
    assert response.status_code == 409 and response.json()["code"] == "run_active"


def test_progress_reports_percent_step_and_rate(alice, capacity_test_pk):
    run_id = alice.client.post(f"{TESTS}{capacity_test_pk}/start/").json()["id"]
    CapacityRun.objects.filter(pk=run_id).update(status="running", progress_percent=42.0, current_step=1,
                                                 achieved_rate=99.5, sent=300, ok=299, errors=1)
    body = alice.client.get(f"{RUNS}{run_id}/progress/").json()
    assert body["status"] == "running"
    assert body["progress_percent"] == 42.0 and body["current_step"] == 1 and body["step_count"] == 3
    assert body["achieved_rate"] == 99.5 and body["sent"] == 300 and body["errors"] == 1


def test_a_finished_run_shows_merged_steps_knee_and_recommendation(alice, capacity_test_pk):
    run = knee_run(capacity_test_pk)
    assert run.status == "succeeded"
    body = alice.client.get(f"{RUNS}{run.pk}/").json()
    assert [s["offered_rate"] for s in body["steps"]] == [50, 100, 200]
    assert [s["ok"] for s in body["steps"]] == [100, 200, 240]
    assert body["steps"][2]["errors"]["timeout"] == 20 and body["steps"][2]["p99_ms"] == pytest.approx(400, rel=0.01)
    assert body["knee_step_index"] == 1 and body["knee_capacity_rps"] == pytest.approx(99.2)
    assert body["knee_code"] == "knee_found"
    # 99.2 req/s over the 2 active members (the drained one does not count) x 0.8, rounded down.
    assert body["healthy_members"] == 2
    assert body["recommended_max_rate_per_member"] == 39.6
    results = alice.client.get(f"{RUNS}{run.pk}/results/?shards=1&histograms=1").json()
    assert len(results["steps"]) == 6 and {s["shard"] for s in results["steps"]} == {0, 1}
    assert all(s["histogram"] for s in results["steps"])
    chart = alice.client.get(f"{RUNS}{run.pk}/chart/").json()
    assert chart["offered_rate"] == [50, 100, 200] and chart["knee_index"] == 1
    assert chart["errors"] == [0, 0, 20] and len(chart["p50_ms"]) == len(chart["p99_ms"]) == 3


def test_apply_writes_max_rate_per_member_audits_and_bumps_the_revision(alice, capacity_test_pk, world):
    run = knee_run(capacity_test_pk)
    revision = LoadBalancer.objects.get(pk=world.acme_lb.pk).revision
    response = alice.client.post(f"{RUNS}{run.pk}/apply/")
    assert response.status_code == 200, response.content
    assert response.json()["applied_at"] and response.json()["pool_region_max_rate_per_member"] == 39.6
    assert PoolRegion.objects.get(pk=world.pool_region.pk).max_rate_per_member == 39.6
    assert LoadBalancer.objects.get(pk=world.acme_lb.pk).revision == revision + 1
    event = AuditEvent.objects.get(action="poolregion.capacity_apply")
    assert event.before["max_rate_per_member"] == 100 and event.after["max_rate_per_member"] == 39.6
    assert AuditEvent.objects.filter(action="capacityrun.apply", object_id=str(run.pk)).exists()


def test_a_run_without_a_knee_has_nothing_to_apply(alice, capacity_test_pk):
    test = CapacityTest.objects.get(pk=capacity_test_pk)
    run = finished_run(test, [[step_result(50, 50, 900, 100)]])
    assert run.status == "failed" and run.knee_code == "first_step_failed"
    assert run.error_code == "first_step_failed" and "already misses the SLO" in run.error
    assert run.recommended_max_rate_per_member is None and "No capacity" in run.recommendation_note
    response = alice.client.post(f"{RUNS}{run.pk}/apply/")
    assert response.status_code == 409 and response.json()["code"] == "no_recommendation"


def test_a_failed_shard_fails_the_run_and_keeps_what_was_measured(capacity_test_pk):
    test = CapacityTest.objects.get(pk=capacity_test_pk)
    run = CapacityRun.objects.create(test=test, status="running", shards_total=2, step_count=1)
    CapacityShard.objects.create(run=run, index=0, status="done", stopped_reason="completed")
    CapacityShard.objects.create(run=run, index=1, status="failed", stopped_reason="error", error="boom")
    execution._step_row(run.pk, 0, 0, step_result(50, 50, 5, 100)).save()
    execution.shard_finished(run.pk)
    execution.shard_finished(run.pk)
    run.refresh_from_db()
    assert run.status == "failed" and run.error_code == "shard_failed" and "boom" in run.error
    assert run.knee_capacity_rps is None
    assert StepResult.objects.filter(run=run, shard__isnull=True).get().ok == 100


# --- allowlist -----------------------------------------------------------------------------------


def test_only_operators_write_the_allowlist_and_tenants_see_what_applies_to_them(alice, charlie, otto, world):
    denied = alice.client.post("/api/v1/capacity-allowlist/", {"cidr": "10.0.0.0/8"}, format="json")
    assert denied.status_code == 403
    globex_entry = otto.client.post("/api/v1/capacity-allowlist/", {"org": "globex", "cidr": "10.9.0.0/16"},
                                    format="json")
    assert globex_entry.status_code == 201
    bad = otto.client.post("/api/v1/capacity-allowlist/", {"cidr": "10.0.0.0/33", "applies_to_all_orgs": True},
                           format="json")
    assert bad.status_code == 400 and bad.json()["code"] == "invalid_cidr"
    # Global by accident is not possible: an entry names its org or says it is for all.
    implicit = otto.client.post("/api/v1/capacity-allowlist/", {"cidr": "10.1.0.0/16"}, format="json")
    assert implicit.status_code == 400 and implicit.json()["code"] == "org_required"
    seen_by_acme = {e["cidr"] for e in alice.client.get("/api/v1/capacity-allowlist/").json()["results"]}
    assert seen_by_acme == {"127.0.0.0/8"}
    seen_by_globex = {e["cidr"] for e in charlie.client.get("/api/v1/capacity-allowlist/").json()["results"]}
    assert seen_by_globex == {"127.0.0.0/8", "10.9.0.0/16"}
    entry_id = globex_entry.json()["id"]
    assert charlie.client.delete(f"/api/v1/capacity-allowlist/{entry_id}/").status_code == 403
    assert otto.client.delete(f"/api/v1/capacity-allowlist/{entry_id}/").status_code == 204
    assert not TargetAllowlist.objects.filter(pk=entry_id).exists()


# --- housekeeping -----------------------------------------------------------------------------------


def test_a_redelivered_shard_is_recorded_as_lost_instead_of_offering_its_load_again(capacity_test_pk):
    """GIVEN a shard whose worker died mid-run (its row still says running), WHEN the broker redelivers
    its message, THEN the shard is marked lost and the run fails, instead of loading the target late."""
    test = CapacityTest.objects.get(pk=capacity_test_pk)
    run = CapacityRun.objects.create(test=test, status="running", shards_total=1, step_count=3)
    CapacityShard.objects.create(run=run, index=0, status="running")
    assert execution.shard_execute(run.pk, 0, worker="w2") == "finalized"
    run.refresh_from_db()
    assert CapacityShard.objects.get(run=run).status == "lost"
    assert run.status == "failed" and run.error_code == "shard_failed"


def test_runs_whose_shards_never_report_are_reaped(capacity_test_pk):
    from datetime import timedelta

    from django.utils import timezone

    test = CapacityTest.objects.get(pk=capacity_test_pk)
    stale = CapacityRun.objects.create(test=test, status="running", plan={"max_duration_s": 10.0},
                                       start_at=timezone.now() - timedelta(seconds=300))
    fresh = CapacityRun.objects.create(test=test, status="running", plan={"max_duration_s": 10.0},
                                       start_at=timezone.now())
    assert execution.reap_stale_runs() == 1
    stale.refresh_from_db()
    fresh.refresh_from_db()
    assert stale.status == "failed" and stale.error_code == "run_stale"
    assert fresh.status == "running"


def test_a_listener_and_an_address_together_are_refused_not_silently_ignored(alice, listener, capacity_test_pk):
    response = alice.client.post(TESTS, {"name": "both", "listener": listener.pk, "address": "127.0.0.1",
                                         "port": 8080, "steps": [50]}, format="json")
    assert response.status_code == 422, response.content
    assert response.json()["code"] == "ambiguous_target"
    assert "address" in response.json()["fields"]
    patched = alice.client.patch(f"{TESTS}{capacity_test_pk}/", {"address": "127.0.0.1", "port": 8080}, format="json")
    assert patched.status_code == 422 and patched.json()["code"] == "ambiguous_target"
