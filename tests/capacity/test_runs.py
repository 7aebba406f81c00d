"""Capacity runs through the whole Celery path: real workers, real local servers, real sockets."""

from __future__ import annotations

import time
import warnings

import pytest

from apps.audit.models import AuditEvent
from apps.balancers.models import LoadBalancer, PoolRegion
from apps.capacity.engine import decode_histogram
from apps.capacity.knee import FIRST_STEP_FAILED
from apps.capacity.models import CapacityRun, CapacityShard, StepResult
from apps.events import types
from apps.events.models import Event
from tests.capacity.capacitykit import answered_all, served_in_full, wait_for_run
from tests.capacity.servers import ServerProcess
from tests.waiting import wait_until

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _workers(cap_workers):
    """Every test here runs on the module's two real workers; none leaves a shard running."""
    yield cap_workers
    for run in CapacityRun.objects.filter(status__in=CapacityRun.ACTIVE):
        CapacityRun.objects.filter(pk=run.pk).update(status=CapacityRun.Status.CANCELLED)
    wait_until(lambda: not CapacityShard.objects.filter(status=CapacityShard.Status.RUNNING).exists(), timeout_s=15)


def _create_and_start(client, **fields) -> int:
    created = client.post("/api/v1/capacity-tests/", fields, format="json")
    assert created.status_code == 201, created.content
    started = client.post(f"/api/v1/capacity-tests/{created.json()['id']}/start/")
    assert started.status_code == 201, started.content
    return started.json()["id"]


def _run_again(client, run: CapacityRun, why: str) -> CapacityRun:
    """Start the run's test once more, after a miss that a loaded machine explains (`why`, said as a warning), and
    wait for the new run: the caller checks that one."""
    warnings.warn(f"{why}, run again: {run.knee_reason}", stacklevel=2)
    started = client.post(f"/api/v1/capacity-tests/{run.test_id}/start/")
    assert started.status_code == 201, started.content
    return wait_for_run(started.json()["id"])


@pytest.mark.quiet
def test_two_shard_run_over_two_workers_merges_to_the_sum_of_its_shards(world, alice):
    with ServerProcess("ok") as srv:
        listener = world.listener(srv.port)
        run_id = _create_and_start(alice.client, name="two-shards", listener=listener.pk,
                                   # What is checked is the merge and an all-passed run's words: an SLO a
                                   # local server holds even when 4 test workers share 2 cores (p99 284 ms
                                   # at 100 req/s was seen there with 100 ms, a stall of the machine).
                                   steps=[[100, 1.0], [200, 1.0]], shards=2, slo_p99_ms=1000)
        run = wait_for_run(run_id)
        if run.knee_code != "all_passed" and run.ok == 300 and run.errors == 0:
            # Every request answered, yet fewer than 95% of the last step's answers landed inside its 1 s window:
            # they ran late on a loaded machine (two whole-suite runs on a machine at 1.12x the reference's time
            # saw 188 of 200 req/s, and the run again passed). A merge that lost or doubled requests fails the
            # checks below either way.
            run = _run_again(alice.client, run, "two-shard run: every request served, some late")
    assert run.status == CapacityRun.Status.SUCCEEDED, (run.error_code, run.error)
    shards = list(CapacityShard.objects.filter(run=run))
    assert len({s.worker for s in shards}) == 2, "each shard ran on its own worker"
    assert all(s.status == CapacityShard.Status.DONE for s in shards)
    merged = {r.index: r for r in StepResult.objects.filter(run=run, shard__isnull=True)}
    per_shard = list(StepResult.objects.filter(run=run, shard__isnull=False))
    assert sorted(merged) == [0, 1]
    for index, row in merged.items():
        parts = [r for r in per_shard if r.index == index]
        assert len(parts) == 2
        assert row.ok == sum(p.ok for p in parts)
        assert row.sent == sum(p.sent for p in parts)
        assert row.error_count == sum(p.error_count for p in parts)
        assert row.errors == {k: sum(p.errors[k] for p in parts) for k in row.errors}
        assert row.offered_rate == pytest.approx(sum(p.offered_rate for p in parts))
        counts = [decode_histogram(p.histogram).get_total_count() for p in parts]
        assert decode_histogram(row.histogram).get_total_count() == sum(counts) == row.ok
        assert row.max_ms == max(p.max_ms for p in parts)
    # The plan offered 100 + 200 requests; a fast local server answers every one.
    assert merged[0].ok + merged[1].ok == 300
    assert merged[1].offered_rate == pytest.approx(200)
    assert run.ok == 300 and run.errors == 0
    # Every step held the SLO: the event says what the run's page says, never "knee at".
    event = Event.objects.get(type="capacity.run_finished", object_id=str(run.pk))
    text = types.summary(event.type, event.object_repr, event.data)
    assert run.knee_code == "all_passed" and "knee at" not in text, run.knee_reason
    assert f"no knee found up to {run.knee_capacity_rps:.1f} req/s" in text and event.data["knee_rps"] is None


def _stalled_under_capacity(run: CapacityRun) -> bool:
    """The knee came early, at a step under the 150 req/s server's capacity (the 50 or 100 req/s one), and the step
    that missed answered every request it sent with a 2xx: a stall's backlog under capacity moves the tail (and may
    move the median), or makes answers land past the step's window (a four-worker suite on 2 cores saw the 50 req/s
    step achieve 46.7 req/s, 95% wanted), but loses nothing. Run again, a server short of capacity misses every
    time: whatever decides the knee, the checks after the runs want it at the 100 req/s step."""
    if run.knee_code == FIRST_STEP_FAILED:
        missed = 0
    elif run.knee_step_index == 0:
        missed = 1
    else:
        return False
    step = run.step_results.filter(shard__isnull=True, index=missed).first()
    return step is not None and (served_in_full(step) or answered_all(step))


@pytest.mark.quiet
def test_knee_is_found_through_celery_and_applying_it_bumps_the_lb_revision(world, alice):
    """GIVEN a server that serves at most 150 req/s behind acme's listener, and a pool with 2 active
    members (a third drained), WHEN a 50 -> 100 -> 250 req/s test runs, THEN the knee is the 100 req/s
    step, the recommendation is 100 / 2 x 0.8 = 40 req/s per member, and applying it writes the
    pool's regional capacity and bumps the LB's revision."""
    # SLO 500 ms: the steps under capacity hold it through a stall of this shared machine (a whole-suite run with
    # four test workers on 2 cores saw the 50 req/s step at p99 420.6 ms, every request served), while 250 req/s
    # against a 150 req/s server misses it twice over: 100 req/s more than it serves queue up, ~1 s of wait by the
    # step's end, and it achieves ~150 req/s, 60% of what it is sent (the knee rule wants 95%).
    with ServerProcess("capacity", "--rate", "150") as srv:
        listener = world.listener(srv.port)
        run_id = _create_and_start(alice.client, name="knee", listener=listener.pk,
                                   steps=[[50, 1.5], [100, 1.5], [250, 1.5]], slo_p99_ms=500,
                                   slo_error_rate=0.01, pool=world.pool.pk, region="us-east", safety_factor=0.8)
        run = wait_for_run(run_id)
        for _ in range(2):
            if not _stalled_under_capacity(run):
                break
            # A stall of the machine, not a queue: a whole-suite run saw the 100 req/s step at p99 200.7 ms with
            # every request served. The test runs again (a server short of capacity misses every run).
            run = _run_again(alice.client, run, "capacity knee: a stall's signature under capacity")
            run_id = run.pk
    assert run.status == CapacityRun.Status.SUCCEEDED, (run.error_code, run.error)
    assert run.knee_step_index == 1, run.knee_reason
    assert run.knee_capacity_rps == pytest.approx(100, rel=0.05)
    assert run.healthy_members == 2
    # The knee's own measured rate (within 5% of 100 above: 102 req/s was seen under load) over the 2 healthy
    # members, times the safety factor, rounded down to 0.1 req/s: 38-42 req/s, never above what was measured.
    share = run.knee_capacity_rps / 2 * 0.8
    assert share - 0.1 - 1e-9 <= run.recommended_max_rate_per_member <= share
    event = Event.objects.get(type="capacity.run_finished", object_id=str(run_id))
    assert f"knee at {run.knee_capacity_rps:.1f} req/s" in types.summary(event.type, event.object_repr, event.data)

    revision = LoadBalancer.objects.get(pk=world.acme_lb.pk).revision
    applied = alice.client.post(f"/api/v1/capacity-runs/{run_id}/apply/")
    assert applied.status_code == 200, applied.content
    assert PoolRegion.objects.get(pk=world.pool_region.pk).max_rate_per_member == run.recommended_max_rate_per_member
    assert LoadBalancer.objects.get(pk=world.acme_lb.pk).revision == revision + 1
    assert AuditEvent.objects.filter(action="poolregion.capacity_apply").exists()
    assert AuditEvent.objects.filter(action="capacityrun.apply", object_id=str(run_id)).exists()
    again = alice.client.post(f"/api/v1/capacity-runs/{run_id}/apply/")
    assert again.status_code == 409 and again.json()["code"] == "already_applied"


def test_progress_is_live_and_cancel_stops_the_shards_within_two_seconds(world, alice):
    with ServerProcess("ok") as srv:
        listener = world.listener(srv.port)
        run_id = _create_and_start(alice.client, name="long", listener=listener.pk, steps=[[100, 10], [200, 10]])

        def progressing():
            body = alice.client.get(f"/api/v1/capacity-runs/{run_id}/progress/").json()
            return body if body["status"] == "running" and body["sent"] > 0 and body["achieved_rate"] > 0 else None

        live = wait_until(progressing, timeout_s=15, interval_s=0.1)
        assert 0 < live["progress_percent"] < 50
        assert live["current_step"] == 0 and live["step_count"] == 2
        cancelled_t = time.monotonic()
        response = alice.client.post(f"/api/v1/capacity-runs/{run_id}/cancel/")
        assert response.status_code == 200 and response.json()["status"] == "cancelled"
        wait_until(lambda: CapacityShard.objects.filter(run_id=run_id, finished_at__isnull=False).count() == 1,
                 timeout_s=5, interval_s=0.02)
        stop_s = time.monotonic() - cancelled_t
        run = wait_for_run(run_id)
    # ~0.3-0.5 s here (monitor every 0.2 s, engine every 50 ms, the records written): 2 s holds on a slower machine.
    assert stop_s < 2.0, f"shard took {stop_s:.2f} s to stop"
    assert run.status == CapacityRun.Status.CANCELLED
    assert run.knee_capacity_rps is None and run.recommended_max_rate_per_member is None
    shard = CapacityShard.objects.get(run=run)
    assert shard.stopped_reason == "cancelled"
    assert run.sent < 100 * 10  # far from the 3,000 requests planned


def test_a_run_that_exceeds_its_rate_cap_is_stopped(world, alice, acme):
    """GIVEN acme's rate cap is 100 req/s, WHEN a closed-loop test with 4 users (no rate limit of its
    own) drives a fast server far past it, THEN the run is stopped with cap_exceeded long before its
    10 s schedule ends."""
    acme.max_test_rate = 100
    acme.save()
    with ServerProcess("ok") as srv:
        listener = world.listener(srv.port)
        run_id = _create_and_start(alice.client, name="greedy", listener=listener.pk, mode="closed", steps=[[4, 10]])
        run = wait_for_run(run_id, timeout_s=20)
    assert run.status == CapacityRun.Status.FAILED
    assert run.error_code == "cap_exceeded", run.error
    assert "rate cap" in run.error
    assert (run.finished_at - run.started_at).total_seconds() < 5
    body = alice.client.get(f"/api/v1/capacity-runs/{run_id}/").json()
    assert body["error_code"] == "cap_exceeded" and body["stopped_reason"] == "cap_exceeded"


def test_a_run_whose_first_step_fails_is_reported_failed_with_the_reason(world, alice):
    """GIVEN a target answering 503 to everything, WHEN a capacity test runs, THEN the run is failed
    (not "succeeded" with "no capacity found"), with the SLO miss of its lowest step as the reason."""
    with ServerProcess("status", "--code", "503") as srv:
        listener = world.listener(srv.port)
        run_id = _create_and_start(alice.client, name="all-503", listener=listener.pk,
                                   steps=[[20, 1.0], [40, 1.0]], slo_p99_ms=100)
        run = wait_for_run(run_id)
    assert run.status == CapacityRun.Status.FAILED
    assert run.error_code == "first_step_failed"
    assert "lowest step (20 req/s) already misses the SLO: error rate 100.00%" in run.error
    assert run.recommended_max_rate_per_member is None
    body = alice.client.get(f"/api/v1/capacity-runs/{run_id}/").json()
    assert body["status"] == "failed" and body["error_code"] == "first_step_failed"
