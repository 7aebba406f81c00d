"""Running runs in-process against the database: outcomes, retries, policies, reaper, webhooks, kinds.

No Celery worker here (the fault tests start real ones): messages a run would send go to a
list through the `send` hook instead of the broker.
"""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from apps.audit.models import AuditEvent
from apps.core import webhooks
from apps.core.errors import DomainError
from apps.scheduling import notify, runner, services
from apps.scheduling.models import Job, JobRun
from tests.factories import MemberFactory, PoolRegionFactory

pytestmark = pytest.mark.django_db


def now() -> datetime:
    return datetime.now(UTC)


def manual_run(job: Job) -> JobRun:
    return services.job_run_now(principal=None, job=job)


def broker_down(tickets: list[runner.Ticket]) -> None:
    """A send that fails as kombu's does when the broker cannot be reached."""
    raise ConnectionError("broker unreachable")


def pretend_running(run: JobRun, *, heartbeat_age_s: float = 0.0, worker: str = "w-old") -> None:
    """GIVEN a worker that claimed the run (and, with an old heartbeat, then vanished)."""
    beat = now() - timedelta(seconds=heartbeat_age_s)
    JobRun.objects.filter(pk=run.pk).update(status="running", started_at=beat, heartbeat_at=beat, worker=worker,
                                            deadline_at=beat + timedelta(seconds=run.job.timeout_s))


def test_a_run_records_its_output_duration_and_the_jobs_last_status(acme, make_job) -> None:
    job = make_job(acme, params={"message": "hello"})
    run = manual_run(job)
    assert runner.run_execute(run.pk, worker="w1") == "succeeded"
    run.refresh_from_db()
    assert run.status == "succeeded" and run.worker == "w1" and run.duration_ms is not None
    assert run.output == {"slept_s": 0.0, "attempt": 1, "message": "hello"}
    assert run.started_at <= run.finished_at
    assert [a["status"] for a in run.attempts] == ["succeeded"]
    job.refresh_from_db()
    assert job.last_status == "succeeded" and job.last_run_at == run.finished_at


def test_a_second_delivery_of_the_same_message_runs_nothing(acme, make_job) -> None:
    run = manual_run(make_job(acme))
    assert runner.run_execute(run.pk, worker="w1") == "succeeded"
    assert runner.run_execute(run.pk, worker="w2") == "not_claimed"
    run.refresh_from_db()
    assert run.worker == "w1" and len(run.attempts) == 1


def test_a_failure_is_retried_on_the_same_run_after_its_backoff(acme, make_job) -> None:
    job = make_job(acme, params={"fail_attempts": 1}, max_retries=2, retry_backoff_s=30)
    run = manual_run(job)
    assert runner.run_execute(run.pk, worker="w1") == "retry"
    run.refresh_from_db()
    assert run.status == "pending" and run.attempt == 2
    assert timedelta(seconds=28) < run.not_before - now() <= timedelta(seconds=30)
    assert run.attempts[0]["status"] == "failed" and "attempt 1" in run.attempts[0]["error"]
    # Delivered early (say the reaper re-sent it): nothing runs, it is sent again for later.
    sent: list[runner.Ticket] = []
    assert runner.run_chunk([run.pk], worker="w1", send=sent.extend) == []
    assert len(sent) == 1 and 28 < sent[0].countdown_s <= 30
    JobRun.objects.filter(pk=run.pk).update(not_before=now() - timedelta(seconds=1))
    assert runner.run_execute(run.pk, worker="w2") == "succeeded"
    run.refresh_from_db()
    assert run.attempt == 2 and [a["status"] for a in run.attempts] == ["failed", "succeeded"]


class _Hooks(BaseHTTPRequestHandler):
    received: list[tuple[dict[str, str], bytes]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        _Hooks.received.append((dict(self.headers), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def hook_server(settings):
    """A receiver on loopback; loopback is allowed for acme's jobs here, as an operator would allow
    a tenant's own network (tenants reach only public addresses by default)."""
    settings.SCHEDULING_TENANT_URL_ALLOW_CIDRS = ["127.0.0.0/8"]
    _Hooks.received = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hooks)
    # shutdown() waits for the loop's next poll: 0.5 s by default, at every test's teardown
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hooks/spillway", _Hooks.received
    server.shutdown()
    server.server_close()


def test_when_retries_run_out_the_run_fails_and_a_signed_webhook_is_sent(acme, make_job, hook_server) -> None:
    url, received = hook_server
    secret = "correct-horse-battery-staple"
    job = make_job(acme, "flaky", params={"fail": True, "message": "backend said no"}, max_retries=1,
                   retry_backoff_s=0, webhook_url=url, webhook_secret=secret)
    run = manual_run(job)
    assert runner.run_execute(run.pk, worker="w1") == "retry"
    assert runner.run_execute(run.pk, worker="w1") == "failed"
    run.refresh_from_db()
    assert run.status == "failed" and run.error == "backend said no" and run.attempt == 2
    assert notify.webhook_send(run.pk).status == "delivered: HTTP 204"
    headers, body = received[0]
    timestamp = int(headers["X-Spillway-Timestamp"])
    assert webhooks.verify(secret, timestamp, body, headers["X-Spillway-Signature"])
    assert not webhooks.verify("another-secret-entirely", timestamp, body, headers["X-Spillway-Signature"])
    assert not webhooks.verify(secret, timestamp, body + b" ", headers["X-Spillway-Signature"])
    assert not webhooks.verify(secret, timestamp, body, headers["X-Spillway-Signature"], now=timestamp + 3600)
    payload = json.loads(body)
    assert payload["event"] == "job_run.failed" and payload["job"]["name"] == "flaky"
    assert payload["run"]["status"] == "failed" and payload["run"]["error"] == "backend said no"
    run.refresh_from_db()
    assert run.webhook_status == "delivered: HTTP 204"


@pytest.mark.parametrize("url", [
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/",
    "http://[::ffff:169.254.169.254]/",
    "http://100.100.100.200/latest/",
    "http://[fd00:ec2::254]/",
    "http://0.0.0.0/",
    "http://224.0.0.1/",
])
def test_webhooks_never_go_to_link_local_or_metadata_addresses(acme, make_job, url) -> None:
    with pytest.raises(webhooks.UnsafeUrl):
        webhooks.request("GET", url, timeout_s=1)
    job = make_job(acme, "hooked", webhook_url="https://hooks.example.com/x", webhook_secret="s" * 20)
    Job.objects.filter(pk=job.pk).update(webhook_url=url)  # as if stored before a rule tightened
    run = manual_run(job)
    outcome = notify.webhook_send(run.pk)
    assert outcome.status.startswith("refused") and not outcome.retry


def test_a_tenants_jobs_reach_only_public_addresses_unless_the_operator_allows_more(acme, ops, make_job,
                                                                                   settings) -> None:
    settings.SCHEDULING_TENANT_URL_ALLOW_CIDRS = []
    for url in ("http://127.0.0.1:9/hook", "http://10.1.2.3/hook", "http://[::1]/hook"):
        with pytest.raises(DomainError) as info:
            make_job(acme, "internal", webhook_url=url, webhook_secret="s" * 20)
        assert info.value.code == "internal_address"
        with pytest.raises(DomainError):
            make_job(acme, "probe", kind="http_check", params={"url": url})
    assert make_job(ops, "ops-hook", webhook_url="http://127.0.0.1:9/hook", webhook_secret="s" * 20).pk
    settings.SCHEDULING_TENANT_URL_ALLOW_CIDRS = ["10.1.0.0/16"]
    assert make_job(acme, "own-network", webhook_url="http://10.1.2.3/hook", webhook_secret="s" * 20).pk


def test_forbid_skips_a_run_while_another_of_the_job_runs(acme, make_job) -> None:
    job = make_job(acme, concurrency_policy="forbid")
    first = manual_run(job)
    pretend_running(first)
    second = manual_run(job)
    assert runner.run_execute(second.pk, worker="w2") == "not_claimed"
    second.refresh_from_db()
    assert second.status == "skipped" and f"run {first.pk}" in second.error


def test_forbid_does_not_wait_for_a_run_whose_worker_is_gone(acme, make_job) -> None:
    job = make_job(acme, concurrency_policy="forbid")
    pretend_running(manual_run(job), heartbeat_age_s=runner.STALE_AFTER_S + 5)
    assert runner.run_execute(manual_run(job).pk, worker="w2") == "succeeded"


def test_replace_cancels_the_running_run(acme, make_job) -> None:
    job = make_job(acme, concurrency_policy="replace")
    first = manual_run(job)
    pretend_running(first)
    second = manual_run(job)
    assert runner.run_execute(second.pk, worker="w2") == "succeeded"
    first.refresh_from_db()
    assert first.status == "cancelled" and f"replaced by run {second.pk}" in first.error


def test_allow_runs_side_by_side(acme, make_job) -> None:
    job = make_job(acme, concurrency_policy="allow")
    pretend_running(manual_run(job))
    assert runner.run_execute(manual_run(job).pk, worker="w2") == "succeeded"


def test_a_claimed_run_carries_its_deadline_and_the_reaper_times_out_a_stuck_one(acme, make_job) -> None:
    run = manual_run(make_job(acme, timeout_s=30, max_retries=0))
    [claimed] = runner.claim_runs([run.pk], worker="w1")
    run.refresh_from_db()
    assert run.deadline_at == run.started_at + timedelta(seconds=30)
    # GIVEN the worker still heartbeats but Celery's hard limit has long passed (a stuck C call)
    JobRun.objects.filter(pk=run.pk).update(deadline_at=now() - timedelta(seconds=runner.HARD_LIMIT_MARGIN_S + 5),
                                            heartbeat_at=now())
    result = runner.reap(send=lambda t: None)
    assert result.timed_out == 1
    run.refresh_from_db()
    assert run.status == "timed_out" and "timed out after 30 s" in run.error
    runner.HEARTBEAT.discard(claimed.pk)


def test_a_late_outcome_never_overwrites_a_cancel(acme, make_job) -> None:
    run = manual_run(make_job(acme))
    [claimed] = runner.claim_runs([run.pk], worker="w1")
    services.run_cancel(principal=None, run=run)
    outcome = runner.execute(claimed)
    assert runner.record([outcome]) == ["discarded"]
    run.refresh_from_db()
    assert run.status == "cancelled"


def test_a_chunk_runs_each_run_with_its_own_start_and_hands_back_what_it_cannot_start(acme, make_job,
                                                                                    monkeypatch) -> None:
    runs = [manual_run(make_job(acme, f"quick-{n}")) for n in range(4)]
    assert runner.run_chunk([r.pk for r in runs[:2]], worker="w1") == ["succeeded", "succeeded"]
    starts = list(JobRun.objects.filter(pk__in=[r.pk for r in runs[:2]]).values_list("started_at", flat=True))
    assert len(set(starts)) == 2
    monkeypatch.setattr(runner, "CHUNK_BUDGET_S", 0.0)  # GIVEN a chunk that has used up its time
    sent: list[runner.Ticket] = []
    assert runner.run_chunk([r.pk for r in runs[2:]], worker="w1", send=sent.extend) == ["succeeded"]
    assert [t.run_id for t in sent] == [runs[3].pk]
    assert JobRun.objects.get(pk=runs[3].pk).status == "pending"


def test_the_reaper_retries_a_run_whose_worker_stopped_heartbeating(acme, make_job) -> None:
    run = manual_run(make_job(acme, max_retries=1, retry_backoff_s=0))
    pretend_running(run, heartbeat_age_s=60, worker="w-dead/pid42")
    sent: list[runner.Ticket] = []
    result = runner.reap(send=sent.extend)
    assert (result.lost, result.retried) == (1, 1)
    run.refresh_from_db()
    assert run.status == "pending" and run.attempt == 2
    assert "worker lost: w-dead/pid42" in run.attempts[0]["error"]


def test_the_reaper_fails_a_lost_run_with_no_retries_left(acme, make_job) -> None:
    run = manual_run(make_job(acme))
    pretend_running(run, heartbeat_age_s=60)
    assert runner.reap(send=lambda t: None).lost == 1
    run.refresh_from_db()
    assert run.status == "failed" and run.error.startswith("worker lost")
    assert runner.reap(send=lambda t: None).lost == 0  # decided once


def test_the_reaper_leaves_live_runs_alone_and_resends_lost_messages(acme, make_job) -> None:
    live = manual_run(make_job(acme, "live"))
    pretend_running(live, heartbeat_age_s=1)
    waiting = manual_run(make_job(acme, "waiting"))
    JobRun.objects.filter(pk=waiting.pk).update(enqueued_at=now() - timedelta(minutes=10))
    sent: list[runner.Ticket] = []
    result = runner.reap(send=sent.extend)
    assert result.lost == 0 and result.resent == 1 and [t.run_id for t in sent] == [waiting.pk]
    assert JobRun.objects.get(pk=live.pk).status == "running"


def test_the_reaper_sends_again_within_seconds_a_run_whose_send_was_never_confirmed(
        acme, make_job, django_capture_on_commit_callbacks) -> None:
    """A run stays without enqueued_at from its commit until its message has left; one still unmarked after
    UNSENT_AFTER_S lost its sender in between and is sent again, long before a lost message's 2 minutes."""
    sent: list[runner.Ticket] = []
    with django_capture_on_commit_callbacks(execute=False) as callbacks:  # committed; the sender dies here
        orphan = manual_run(make_job(acme, "orphan"))
        fresh = manual_run(make_job(acme, "fresh"))
    assert len(callbacks) == 2
    assert JobRun.objects.filter(pk__in=[orphan.pk, fresh.pk], enqueued_at__isnull=True).count() == 2
    aged = now() - timedelta(seconds=runner.UNSENT_AFTER_S + 1)
    JobRun.objects.filter(pk=orphan.pk).update(created_at=aged)
    queued = manual_run(make_job(acme, "queued"))  # sent and still in the queue behind other work
    JobRun.objects.filter(pk=queued.pk).update(created_at=aged, enqueued_at=aged)

    result = runner.reap(send=sent.extend)
    assert [t.run_id for t in sent] == [orphan.pk] and result.resent == 1  # a fresh one may still be on its way
    assert JobRun.objects.get(pk=orphan.pk).enqueued_at is not None
    assert runner.reap(send=sent.extend).resent == 0  # once


def test_a_reaper_whose_resend_fails_leaves_the_run_to_the_next_reap_and_a_late_retry_gets_one_message(
        acme, make_job) -> None:
    orphan = manual_run(make_job(acme, "orphan"))  # not marked: on_commit does not run in this test's transaction
    JobRun.objects.filter(pk=orphan.pk).update(created_at=now() - timedelta(seconds=runner.UNSENT_AFTER_S + 1))
    with pytest.raises(ConnectionError):
        runner.reap(send=broker_down)
    assert JobRun.objects.get(pk=orphan.pk).enqueued_at is None  # not 2 minutes more: the next reap sends it
    sent: list[runner.Ticket] = []
    assert runner.reap(send=sent.extend).resent == 1 and [t.run_id for t in sent] == [orphan.pk]

    # A retry sent 5 minutes ago with a 5-minute countdown comes due now: its message is arriving, not lost.
    retry = manual_run(make_job(acme, "retry"))
    long_ago = now() - timedelta(minutes=5)
    JobRun.objects.filter(pk=retry.pk).update(enqueued_at=long_ago, created_at=long_ago,
                                              not_before=now() - timedelta(seconds=1))
    sent.clear()
    assert runner.reap(send=sent.extend).resent == 0 and sent == []


def test_a_run_is_marked_sent_only_once_its_message_has_left(acme, make_job, monkeypatch,
                                                             django_capture_on_commit_callbacks) -> None:
    left: list[runner.Ticket] = []
    monkeypatch.setattr(runner, "enqueue", left.extend)  # the broker, as far as this test needs one

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        run = manual_run(make_job(acme))
    assert len(callbacks) == 1 and [t.run_id for t in left] == [run.pk]
    assert JobRun.objects.get(pk=run.pk).enqueued_at is not None
    released = manual_run(make_job(acme, "second"))
    JobRun.objects.filter(pk=released.pk).update(enqueued_at=None)
    with pytest.raises(ConnectionError):
        runner.send_and_mark([runner.Ticket(released.pk, 60)], broker_down)
    assert JobRun.objects.get(pk=released.pk).enqueued_at is None  # the reaper will send it when the broker is back


# --- kinds that change load balancers --------------------------------------------------------


def test_a_drain_window_job_drains_the_member_and_the_audit_log_names_the_job(acme, make_job) -> None:
    pool_region = PoolRegionFactory(pool__org=acme)
    member = MemberFactory(pool=pool_region.pool, region=pool_region.region)
    start = make_job(acme, "drain-start", kind="member_set_state", params={"member": member.pk,
                                                                           "admin_state": "drain"})
    assert runner.run_execute(manual_run(start).pk, worker="w1") == "succeeded"
    member.refresh_from_db()
    assert member.admin_state == "drain"
    assert AuditEvent.objects.filter(action="member.state", actor=f"job:{start.pk}").exists()
    end = make_job(acme, "drain-end", kind="member_set_state", params={"member": member.pk, "admin_state": "active",
                                                                       "weight": 50})
    run = manual_run(end)
    runner.run_execute(run.pk, worker="w1")
    member.refresh_from_db()
    assert (member.admin_state, member.weight) == ("active", 50)
    assert JobRun.objects.get(pk=run.pk).output["before"]["admin_state"] == "drain"


def test_a_job_whose_member_was_deleted_fails_with_a_clear_error(acme, make_job) -> None:
    pool_region = PoolRegionFactory(pool__org=acme)
    member = MemberFactory(pool=pool_region.pool, region=pool_region.region)
    job = make_job(acme, kind="member_set_state", params={"member": member.pk, "admin_state": "maint"})
    member.delete()
    run = manual_run(job)
    assert runner.run_execute(run.pk, worker="w1") == "failed"
    assert "no longer exists" in JobRun.objects.get(pk=run.pk).error


def test_a_capacity_scaler_job_scales_the_pool_region(acme, make_job) -> None:
    pool_region = PoolRegionFactory(pool__org=acme, capacity_scaler=1.0)
    job = make_job(acme, kind="pool_capacity_scaler", params={"pool_region": pool_region.pk,
                                                              "capacity_scaler": 0.5})
    assert runner.run_execute(manual_run(job).pk, worker="w1") == "succeeded"
    pool_region.refresh_from_db()
    assert pool_region.capacity_scaler == 0.5


def test_an_http_check_job_passes_on_the_expected_status(acme, make_job, hook_server) -> None:
    url, _ = hook_server
    ok = make_job(acme, "check-ok", kind="http_check", params={"url": url, "expect_status": 501})
    bad = make_job(acme, "check-bad", kind="http_check", params={"url": url})
    assert runner.run_execute(manual_run(ok).pk, worker="w1") == "succeeded"  # GET is not implemented: 501
    run = manual_run(bad)
    assert runner.run_execute(run.pk, worker="w1") == "failed"
    assert "answered 501, expected 200" in JobRun.objects.get(pk=run.pk).error


# --- with threads: cancel and timeout reach a run while it executes ---------------------------


def _run_in_thread(run_id: int) -> tuple[threading.Thread, list[str]]:
    from django.db import connection

    result: list[str] = []

    def target() -> None:
        try:
            result.append(runner.run_execute(run_id, worker="thread"))
        finally:
            connection.close()

    thread = threading.Thread(target=target)
    thread.start()
    return thread, result


def _wait_status(run_id: int, status: str, timeout_s: float = 10) -> None:
    deadline = time.monotonic() + timeout_s
    while JobRun.objects.get(pk=run_id).status != status:
        assert time.monotonic() < deadline, f"run {run_id} never reached {status}"
        time.sleep(0.05)


@pytest.mark.django_db(transaction=True)
def test_a_cancelled_run_stops_while_it_runs(acme, make_job) -> None:
    run = manual_run(make_job(acme, params={"sleep_s": 30}))
    thread, result = _run_in_thread(run.pk)
    _wait_status(run.pk, "running")
    services.run_cancel(principal=None, run=run)
    thread.join(timeout=runner.HEARTBEAT_INTERVAL_S * 3)
    assert not thread.is_alive() and result == ["discarded"]
    assert JobRun.objects.get(pk=run.pk).status == "cancelled"


@pytest.mark.django_db(transaction=True)
def test_a_run_past_its_timeout_is_stopped_and_marked_timed_out(acme, make_job) -> None:
    run = manual_run(make_job(acme, params={"sleep_s": 30}, timeout_s=1))
    started = time.monotonic()
    thread, result = _run_in_thread(run.pk)
    thread.join(timeout=10)
    assert result == ["timed_out"] and time.monotonic() - started < 1 + runner.HEARTBEAT_INTERVAL_S * 2
    run.refresh_from_db()
    assert run.status == "timed_out" and run.error == "timed out after 1 s"


def test_old_finished_runs_are_pruned_and_live_ones_kept(acme, make_job) -> None:
    job = make_job(acme)
    old, recent, stuck = manual_run(job), manual_run(job), manual_run(job)
    long_ago = now() - timedelta(days=services.RUN_RETENTION_DAYS + 1)
    JobRun.objects.filter(pk=old.pk).update(status="succeeded", scheduled_for=long_ago)
    JobRun.objects.filter(pk=recent.pk).update(status="succeeded")
    JobRun.objects.filter(pk=stuck.pk).update(scheduled_for=long_ago - timedelta(seconds=1))  # still pending
    assert services.run_history_prune() == 1
    assert set(JobRun.objects.values_list("pk", flat=True)) == {recent.pk, stuck.pk}


@pytest.mark.parametrize("catch_up_first", [True, False])
def test_a_catch_up_and_an_on_time_slot_sent_together_under_forbid_both_run_one_after_the_other(
    acme, make_job, catch_up_first
) -> None:
    """Dispatchers down past the grace: the next tick makes a catch-up run and the on-time slot, sent together.
    Under forbid, whichever started second was skipped (bench-chaos saw the catch-up skipped, and with it every
    missed slot, and the on-time slot skipped): now the second waits for the first, then runs."""
    job = make_job(acme, "minutely", concurrency_policy="forbid")
    now = datetime.now(UTC)
    catch_up = JobRun.objects.create(job=job, scheduled_for=now - timedelta(minutes=3), missed_since=now,
                                     trigger=JobRun.Trigger.CATCH_UP)
    on_time = JobRun.objects.create(job=job, scheduled_for=now, trigger=JobRun.Trigger.SCHEDULE)
    first, second = (catch_up, on_time) if catch_up_first else (on_time, catch_up)
    sent: list[runner.Ticket] = []
    claimed = runner.claim_runs([first.pk, second.pk], worker="w1", send=sent.extend)
    assert [r.pk for r in claimed] == [first.pk]
    second.refresh_from_db()
    assert second.status == JobRun.Status.PENDING and [t.run_id for t in sent] == [second.pk]
    JobRun.objects.filter(pk=first.pk).update(status=JobRun.Status.SUCCEEDED, finished_at=now)
    assert [r.pk for r in runner.claim_runs([second.pk], worker="w1")] == [second.pk]
