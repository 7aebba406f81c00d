"""Running JobRuns: claim, heartbeat, enforce the timeout, record the outcome, retry or notify.

Exactly once per attempt comes from row locks and conditional UPDATEs: a worker claims
runs with ``SELECT ... FOR UPDATE SKIP LOCKED WHERE status='pending'`` and marks them
`running` in the same transaction, and an outcome is written with
``UPDATE ... WHERE status='running' AND attempt=?``. So a message the broker delivers
twice starts nothing the second time, and a run that was cancelled, replaced or given
up by the reaper while it ran cannot overwrite that decision when it finally returns.

Throughput: quick kinds (a member drain, a scaler change: milliseconds each) travel in
chunks of up to CHUNK_SIZE runs per message. A chunk is claimed in one transaction and
its outcomes are written in one transaction, so a burst of 1,000 runs costs ~30
messages and ~60 commits instead of 1,000 and 2,000. Runs inside a chunk execute one
after another, each with its own `started_at`; if a chunk has used up CHUNK_BUDGET_S,
its remaining runs are released and sent on as messages of their own, so a slow run
cannot hold the others back for long. Kinds that may take long always travel alone.

Retries reuse the same JobRun row (the slot stays unique): `attempt` counts up, the
failed attempt is appended to `attempts`, and the row goes back to `pending` with
`not_before` = now + backoff (doubling per failure).

A run whose worker died stops heartbeating; the reaper (`reap`, every few seconds from
beat and from `manage.py dispatcher`) retries it or marks it failed. Nothing stays
`running` forever. A worker that dies after executing a run but before recording it
leaves the run to the reaper too, so under crashes a run may execute again: at least
once for side effects, exactly once as a recorded slot.
"""

from __future__ import annotations

import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.core.errors import DomainError
from apps.events.services import event_emit
from apps.scheduling import pgsql, planning, registry
from apps.scheduling.models import Job, JobRun

log = logging.getLogger(__name__)

HEARTBEAT_INTERVAL_S = 2.0
STALE_AFTER_S = 20.0  # no heartbeat for this long: the worker is gone
REENQUEUE_AFTER_S = 120.0  # a pending run whose message should have arrived by now is sent again
UNSENT_AFTER_S = 5.0  # a pending run whose send was never confirmed (its sender died) is sent again
HARD_LIMIT_MARGIN_S = 30  # Celery kills the process this long after the soft timeout
CHUNK_SIZE = 50  # at most this many quick runs per message
CHUNK_SPREAD = 4  # a small burst is still split over this many messages, so several workers start at once
CHUNK_BUDGET_S = 1.0  # a chunk releases its unstarted runs after this long
FLUSH_EVERY_S = 0.25  # outcomes wait at most this long (or the end of the chunk) to be written
MAX_ERROR_CHARS = 4000


@dataclass(frozen=True)
class Ticket:
    """One run to send: its id, its timeout, whether it is quick, and how long to hold it back."""

    run_id: int
    timeout_s: int
    countdown_s: float = 0.0
    quick: bool = False


def enqueue(tickets: Iterable[Ticket]) -> int:
    """Send run messages through one producer connection; quick runs in chunks. Returns messages sent."""
    from apps.scheduling.tasks import run_job_task, run_jobs_task

    tickets = list(tickets)
    if not tickets:
        return 0
    quick = [t for t in tickets if t.quick and t.countdown_s <= 0]
    alone = [t for t in tickets if not (t.quick and t.countdown_s <= 0)]
    sent = 0
    size = max(1, min(CHUNK_SIZE, math.ceil(len(quick) / CHUNK_SPREAD)))
    with run_job_task.app.producer_or_acquire() as producer:
        for start in range(0, len(quick), size):
            chunk = quick[start:start + size]
            soft_s = max(t.timeout_s for t in chunk) + CHUNK_BUDGET_S
            run_jobs_task.apply_async(args=[[t.run_id for t in chunk]], producer=producer,
                                      soft_time_limit=soft_s, time_limit=soft_s + HARD_LIMIT_MARGIN_S)
            sent += 1
        for ticket in alone:
            options: dict[str, Any] = {"soft_time_limit": ticket.timeout_s,
                                       "time_limit": ticket.timeout_s + HARD_LIMIT_MARGIN_S, "producer": producer}
            if ticket.countdown_s > 0:
                options["countdown"] = ticket.countdown_s
            run_job_task.apply_async(args=[ticket.run_id], **options)
            sent += 1
    return sent


def warm_producer() -> None:
    """Open the broker connection and declare the queue now: the first send otherwise pays ~100 ms,
    and the first send of a dispatcher is the first run of a burst."""
    from apps.scheduling.tasks import run_job_task

    app = run_job_task.app
    with app.producer_or_acquire() as producer:
        producer.connection.ensure_connection(max_retries=3)
        for queue in app.amqp.queues.values():
            producer.maybe_declare(queue)


def send_and_mark(tickets: list[Ticket], send: Callable[[list[Ticket]], Any] | None = None) -> None:
    """Send, then record that the messages left: a run still unmarked a few seconds after it became
    pending lost its sender between commit and send, and the reaper sends it again."""
    if not tickets:
        return
    (send or enqueue)(tickets)
    # Not indexed, so a HOT update. Pending runs only: one a worker claimed meanwhile needs no mark (a run that goes
    # back to pending is unmarked again, and sent again through here).
    JobRun.objects.filter(pk__in=[t.run_id for t in tickets], status=JobRun.Status.PENDING).update(
        enqueued_at=timezone.now())


def enqueue_on_commit(tickets: list[Ticket], send: Callable[[list[Ticket]], Any] | None = None) -> None:
    if tickets:
        transaction.on_commit(lambda: send_and_mark(tickets, send))


# --- heartbeat: one thread per worker process for all the runs it holds ------------------------


class _Heartbeat:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[int, tuple[int, registry.RunContext | None, float]] = {}
        self._thread: threading.Thread | None = None
        self._pid = 0

    def add(self, run_id: int, attempt: int, ctx: registry.RunContext | None, deadline_monotonic: float) -> None:
        with self._lock:
            self._runs[run_id] = (attempt, ctx, deadline_monotonic)
            alive = self._thread is not None and self._thread.is_alive() and self._pid == os.getpid()
            if not alive:  # first run in this (possibly freshly forked) process
                self._pid = os.getpid()
                self._thread = threading.Thread(target=self._loop, name="jobrun-heartbeat", daemon=True)
                self._thread.start()

    def discard(self, run_id: int) -> None:
        with self._lock:
            self._runs.pop(run_id, None)

    def _loop(self) -> None:
        while True:
            time.sleep(HEARTBEAT_INTERVAL_S)
            try:
                self.beat()
            except Exception:
                log.exception("heartbeat failed; retrying")
                connection.close()  # this thread's own connection; a fresh one next time

    def beat(self) -> None:
        with self._lock:
            runs = dict(self._runs)
        if not runs:
            # Idle: give the connection back rather than hold a database session per worker process.
            connection.close()
            return
        now_mono = time.monotonic()
        for _attempt, ctx, deadline in runs.values():
            if ctx is not None and now_mono > deadline and not ctx.cancel_event.is_set():
                ctx.cancel_reason = "timeout"
                ctx.cancel_event.set()
        alive = Q()
        for run_id, (attempt, _ctx, _deadline) in runs.items():
            alive |= Q(pk=run_id, attempt=attempt)
        live = JobRun.objects.filter(alive, status=JobRun.Status.RUNNING)
        live.update(heartbeat_at=timezone.now())
        still_running = set(live.values_list("pk", flat=True))
        for run_id, (_attempt, ctx, _deadline) in runs.items():
            if ctx is not None and run_id not in still_running and not ctx.cancel_event.is_set():
                ctx.cancel_reason = "cancelled"  # replaced, cancelled by a user, or reaped
                ctx.cancel_event.set()


HEARTBEAT = _Heartbeat()


# --- claim ----------------------------------------------------------------------------------


def claim_runs(run_ids: list[int], *, worker: str, now: datetime | None = None,
               send: Callable[[list[Ticket]], Any] | None = None) -> list[JobRun]:
    """Take pending runs for this worker; returns those now running here, in the order given.

    Runs of jobs that allow overlap are claimed with one conditional UPDATE (PostgreSQL). The rest
    take the careful path: concurrency policies are decided under the job row lock, so "is another
    run of this job running?" cannot race: forbid marks the newcomer skipped, replace cancels the
    old one.
    """
    now = now or timezone.now()
    order = {run_id: index for index, run_id in enumerate(run_ids)}
    claimed: list[JobRun] = []
    rest = run_ids
    if connection.vendor == "postgresql":
        # The common case in one statement: runs of jobs that allow overlap, pending and due.
        taken = set(pgsql.claim_allow(run_ids, worker=worker, now=now))
        if taken:
            claimed = list(JobRun.objects.select_related("job", "job__org").filter(pk__in=taken).order_by())
            rest = [run_id for run_id in run_ids if run_id not in taken]
    if rest:
        claimed += _claim_careful(rest, worker=worker, now=now, send=send)
    claimed.sort(key=lambda r: order[r.pk])
    for run in claimed:
        HEARTBEAT.add(run.pk, run.attempt, None, float("inf"))
    return claimed


def _claim_careful(run_ids: list[int], *, worker: str, now: datetime,
                   send: Callable[[list[Ticket]], Any] | None) -> list[JobRun]:
    """Claims that need the job row lock (forbid, replace), early retries, and the portable path."""
    claimed: list[JobRun] = []
    early: list[Ticket] = []
    with transaction.atomic():
        # By primary key only (the status is checked below): a plain index lookup whatever the statistics
        # of the live-runs index say, and no ORDER BY to sort for.
        runs = [run for run in JobRun.objects.select_for_update(skip_locked=True, of=("self",))
                .select_related("job", "job__org").filter(pk__in=run_ids).order_by()
                if run.status == JobRun.Status.PENDING]
        order = {run_id: index for index, run_id in enumerate(run_ids)}
        runs.sort(key=lambda r: order[r.pk])
        guarded = sorted({r.job_id for r in runs if r.job.concurrency_policy != Job.ConcurrencyPolicy.ALLOW})
        busy: dict[int, int] = {}  # job id -> a run of it that is running
        catching_up: set[int] = set()  # jobs whose running run is a catch-up (it stands for slots already missed)
        if guarded:
            # The job rows serialise claims of one job (in id order: no deadlock between workers).
            list(Job.objects.select_for_update().filter(pk__in=guarded).order_by("pk").values_list("pk"))
            fresh = now - timedelta(seconds=STALE_AFTER_S)
            running = JobRun.objects.filter(job_id__in=guarded, status=JobRun.Status.RUNNING, heartbeat_at__gte=fresh)
            for job_id, run_pk, trigger in running.values_list("job_id", "pk", "trigger"):
                busy[job_id] = run_pk
                if trigger == JobRun.Trigger.CATCH_UP:
                    catching_up.add(job_id)
        skipped: list[tuple[JobRun, int]] = []
        replaced: list[int] = []  # runs that replace whatever of their job is running
        superseded: list[tuple[JobRun, int]] = []  # claimed in this chunk, then replaced by a later one
        for run in runs:
            if run.not_before is not None and run.not_before > now:
                # Early (the reaper re-sent it, or a broker ignored the countdown): come back later.
                early.append(Ticket(run.pk, run.job.timeout_s, (run.not_before - now).total_seconds()))
                continue
            policy = run.job.concurrency_policy
            catch_up_meets_slot = run.job_id in busy and (
                run.job_id in catching_up or run.trigger == JobRun.Trigger.CATCH_UP)
            if catch_up_meets_slot and policy == Job.ConcurrencyPolicy.FORBID:
                # The dispatcher made a catch-up and an on-time slot of this job in the same tick (dispatchers were
                # down past the grace); sent together, they met here, and forbid skipped whichever came second:
                # the on-time slot, or the catch-up and with it every missed slot (bench-chaos saw both). Neither
                # overlaps a run of its own job: the second waits for the first and runs after it.
                early.append(Ticket(run.pk, run.job.timeout_s, 1.0))
                continue
            if run.job_id in busy and policy == Job.ConcurrencyPolicy.FORBID:
                skipped.append((run, busy[run.job_id]))
                continue
            if run.job_id in busy and policy == Job.ConcurrencyPolicy.REPLACE:
                earlier = next((r for r in claimed if r.pk == busy[run.job_id]), None)
                if earlier is not None:
                    claimed.remove(earlier)
                    superseded.append((earlier, run.pk))
                else:
                    replaced.append(run.pk)
            if policy != Job.ConcurrencyPolicy.ALLOW:
                busy[run.job_id] = run.pk
                if run.trigger == JobRun.Trigger.CATCH_UP:
                    catching_up.add(run.job_id)  # a slot of this job later in this chunk waits for it
                else:
                    catching_up.discard(run.job_id)
            claimed.append(run)
        for run, other in skipped:
            JobRun.objects.filter(pk=run.pk).update(
                status=JobRun.Status.SKIPPED, finished_at=now,
                error=f"skipped: run {other} of this job was still running (policy forbid)")
            _set_last_status([run.job_id], JobRun.Status.SKIPPED, now)
        for run_id in replaced:
            run = next(r for r in claimed if r.pk == run_id)
            JobRun.objects.filter(job_id=run.job_id, status=JobRun.Status.RUNNING).update(
                status=JobRun.Status.CANCELLED, finished_at=now, error=f"replaced by run {run.pk} (policy replace)")
        for run, by in superseded:
            JobRun.objects.filter(pk=run.pk).update(status=JobRun.Status.CANCELLED, finished_at=now,
                                                    error=f"replaced by run {by} (policy replace)")
        by_timeout: dict[int, list[int]] = {}
        for run in claimed:
            by_timeout.setdefault(run.job.timeout_s, []).append(run.pk)
        for timeout_s, run_pks in by_timeout.items():  # usually one or two distinct timeouts
            JobRun.objects.filter(pk__in=run_pks).update(
                status=JobRun.Status.RUNNING, started_at=now, heartbeat_at=now, worker=worker[:200], finished_at=None,
                deadline_at=now + timedelta(seconds=timeout_s))
        for run in claimed:
            run.status, run.started_at, run.heartbeat_at, run.worker = JobRun.Status.RUNNING, now, now, worker[:200]
            run.deadline_at = now + timedelta(seconds=run.job.timeout_s)
    if early:
        (send or enqueue)(early)
    return claimed


# --- execute --------------------------------------------------------------------------------


@dataclass
class Outcome:
    run: JobRun
    status: str
    output: Any = None
    error: str = ""
    duration_ms: int | None = None
    started_at: datetime | None = None


def execute(run: JobRun) -> Outcome:
    """Run one claimed run's kind; never raises (every failure becomes the run's error)."""
    job = run.job
    started_at = timezone.now()
    ctx = registry.RunContext(run_id=run.pk, job_id=job.pk, attempt=run.attempt, scheduled_for=run.scheduled_for,
                           principal=registry.job_principal(job))
    started = time.monotonic()
    HEARTBEAT.add(run.pk, run.attempt, ctx, started + job.timeout_s)
    status, output, error = JobRun.Status.SUCCEEDED, None, ""
    try:
        lapsed = registry.creator_authority_lapsed(job)
        if lapsed:
            # The job must not outlive its creator's authority: this run fails and the job is paused until
            # someone who may (an editor) looks at it and enables it again, which makes it theirs.
            Job.objects.filter(pk=job.pk).update(enabled=False, next_fire_at=None)
            raise registry.JobFailed(f"creator_revoked: {lapsed}; the job is paused")
        output = registry.get_kind(job.kind).execute(ctx, job.params)
    except SoftTimeLimitExceeded:
        status, error = JobRun.Status.TIMED_OUT, f"timed out after {job.timeout_s} s"
    except registry.RunCancelled:
        if ctx.cancel_reason == "timeout":
            status, error = JobRun.Status.TIMED_OUT, f"timed out after {job.timeout_s} s"
        else:
            status, error = JobRun.Status.CANCELLED, "cancelled while running"
    except registry.JobFailed as exc:
        status, error = JobRun.Status.FAILED, str(exc)
    except DomainError as exc:
        status, error = JobRun.Status.FAILED, f"{exc.code}: {exc.detail}"
    except Exception as exc:
        log.exception("job %s run %s crashed", job.pk, run.pk)
        status, error = JobRun.Status.FAILED, f"{type(exc).__name__}: {exc}"
    return Outcome(run, status, _plain(output), error, int((time.monotonic() - started) * 1000), started_at)


def _plain(output: Any) -> Any:
    """Executor output as strict JSON (dates as text; NaN, which jsonb refuses, as text too)."""
    if output is None:
        return None
    try:
        return json.loads(json.dumps(output, default=str, allow_nan=False))
    except ValueError:
        return {"repr": repr(output)[:2000]}


def run_chunk(run_ids: list[int], *, worker: str, send: Callable[[list[Ticket]], Any] | None = None) -> list[str]:
    """Claim, execute and record runs (one message's worth); returns what happened to each claimed run."""
    claimed = claim_runs(run_ids, worker=worker, send=send)
    results: list[str] = []
    pending: list[Outcome] = []
    chunk_started = last_flush = time.monotonic()
    try:
        for index, run in enumerate(claimed):
            if index > 0 and time.monotonic() - chunk_started > CHUNK_BUDGET_S:
                results += record(pending, send=send)
                pending = []
                release(claimed[index:], send=send)
                break
            pending.append(execute(run))
            if time.monotonic() - last_flush > FLUSH_EVERY_S:
                results += record(pending, send=send)
                pending, last_flush = [], time.monotonic()
        results += record(pending, send=send)
    finally:
        # Whatever happened (a timeout inside record, a lost database), this process stops vouching
        # for these runs: any left `running` lose their heartbeat and the reaper takes them.
        for run in claimed:
            HEARTBEAT.discard(run.pk)
    return results


def run_execute(run_id: int, *, worker: str) -> str:
    """One run: claim, execute, record. Returns its outcome, or "not_claimed"."""
    results = run_chunk([run_id], worker=worker)
    return results[0] if results else "not_claimed"


def release(runs: list[JobRun], *, send: Callable[[list[Ticket]], Any] | None = None) -> None:
    """Hand claimed-but-unstarted runs back (pending) and send each as its own message."""
    tickets: list[Ticket] = []
    for run in runs:
        HEARTBEAT.discard(run.pk)
        mine = JobRun.objects.filter(pk=run.pk, status=JobRun.Status.RUNNING, attempt=run.attempt, worker=run.worker)
        if mine.update(status=JobRun.Status.PENDING, started_at=None, heartbeat_at=None, enqueued_at=None):
            tickets.append(Ticket(run.pk, run.job.timeout_s))
    send_and_mark(tickets, send)


# --- record ---------------------------------------------------------------------------------


def record(outcomes: list[Outcome], *, now: datetime | None = None,
           send: Callable[[list[Ticket]], Any] | None = None) -> list[str]:
    """Write outcomes: final, or back to pending for a retry. Each write is conditional on the run
    still being this attempt's; a lost race reads "discarded". On PostgreSQL a chunk of final
    outcomes is one statement (pgsql.record_final), which also sets the jobs' last status."""
    if not outcomes:
        return []
    now = now or timezone.now()
    finals = [o for o in outcomes if _is_final(o)]
    postgresql = connection.vendor == "postgresql"
    if postgresql and len(finals) == len(outcomes):
        written = pgsql.record_final(finals, [_entry(o, now) for o in finals], now=now,
                                     max_error_chars=MAX_ERROR_CHARS)
        results = [written.get(o.run.pk, "discarded") for o in outcomes]
        _after_record(outcomes, results)
        return results
    results: list[str] = []
    retries: list[Ticket] = []
    final_by_status: dict[str, list[int]] = {}
    with transaction.atomic():
        written = pgsql.record_final(finals, [_entry(o, now) for o in finals], now=now,
                                     max_error_chars=MAX_ERROR_CHARS) if postgresql and finals else {}
        for outcome in outcomes:
            if outcome.run.pk in written:
                results.append(written[outcome.run.pk])
                continue
            result = _record_one(outcome, now, retries)
            results.append(result)
            if result not in ("retry", "discarded"):
                final_by_status.setdefault(result, []).append(outcome.run.job_id)
        for status, job_ids in final_by_status.items():
            _set_last_status(job_ids, status, now)
        enqueue_on_commit(retries, send)
        _after_record(outcomes, results)
    return results


def _after_record(outcomes: list[Outcome], results: list[str]) -> None:
    for outcome, result in zip(outcomes, results, strict=True):
        if result in (JobRun.Status.FAILED, JobRun.Status.TIMED_OUT):
            job = outcome.run.job
            event_emit("job.failed", org=job.org, obj=job, object_repr=job.name,
                       data={"status": result, "run": outcome.run.pk, "error": (outcome.error or "")[:300]})
        if result in (JobRun.Status.FAILED, JobRun.Status.TIMED_OUT) and outcome.run.job.webhook_url:
            transaction.on_commit(lambda run_id=outcome.run.pk: _send_webhook_later(run_id))
        HEARTBEAT.discard(outcome.run.pk)


def _entry(outcome: Outcome, now: datetime) -> dict[str, Any]:
    run = outcome.run
    started_at = outcome.started_at or run.started_at
    return {"attempt": run.attempt, "status": outcome.status, "worker": run.worker,
            "error": outcome.error[:500], "started_at": started_at.isoformat() if started_at else None,
            "finished_at": now.isoformat(), "duration_ms": outcome.duration_ms}


def _is_final(outcome: Outcome) -> bool:
    failed = outcome.status in (JobRun.Status.FAILED, JobRun.Status.TIMED_OUT)
    retry = failed and outcome.run.attempt < outcome.run.max_attempts
    return not retry


def _record_one(outcome: Outcome, now: datetime, retries: list[Ticket]) -> str:
    run, status = outcome.run, outcome.status
    job = run.job
    error = outcome.error[:MAX_ERROR_CHARS]
    started_at = outcome.started_at or run.started_at
    entry = _entry(outcome, now)
    mine = JobRun.objects.filter(pk=run.pk, status=JobRun.Status.RUNNING, attempt=run.attempt)
    if status in (JobRun.Status.FAILED, JobRun.Status.TIMED_OUT) and run.attempt < run.max_attempts:
        delay_s = planning.retry_delay_s(backoff_s=job.retry_backoff_s, failed_attempt=run.attempt)
        if not mine.update(status=JobRun.Status.PENDING, attempt=run.attempt + 1, attempts=[*run.attempts, entry],
                           not_before=now + timedelta(seconds=delay_s), enqueued_at=None, error=error,
                           output=outcome.output, duration_ms=outcome.duration_ms, started_at=started_at,
                           heartbeat_at=None):
            return "discarded"
        retries.append(Ticket(run.pk, job.timeout_s, float(delay_s)))
        return "retry"
    if not mine.update(status=status, started_at=started_at, finished_at=now, duration_ms=outcome.duration_ms,
                       output=outcome.output, error=error, attempts=[*run.attempts, entry]):
        return "discarded"
    return status


def _set_last_status(job_ids: list[int], status: str, now: datetime) -> None:
    # A run that finishes late must not hide the outcome of a newer one.
    Job.objects.filter(pk__in=job_ids).filter(Q(last_run_at__isnull=True) | Q(last_run_at__lte=now)).update(
        last_status=status, last_run_at=now)


def _send_webhook_later(run_id: int) -> None:
    from apps.scheduling.tasks import send_webhook_task

    send_webhook_task.delay(run_id)


# --- reaper ---------------------------------------------------------------------------------


@dataclass
class ReapResult:
    lost: int = 0
    timed_out: int = 0
    retried: int = 0
    resent: int = 0


def reap(*, now: datetime | None = None, stale_after_s: float = STALE_AFTER_S,
         reenqueue_after_s: float = REENQUEUE_AFTER_S, unsent_after_s: float = UNSENT_AFTER_S, limit: int = 200,
         send: Callable[[list[Ticket]], Any] | None = None) -> ReapResult:
    """Retry or fail runs whose worker died or overran its hard limit; resend lost pending messages."""
    now = now or timezone.now()
    result = ReapResult()
    hard_limit_passed = now - timedelta(seconds=HARD_LIMIT_MARGIN_S)
    with transaction.atomic():
        dead = list(JobRun.objects.select_for_update(skip_locked=True, of=("self",)).select_related("job")
                    .filter(status=JobRun.Status.RUNNING)
                    .filter(Q(heartbeat_at__lt=now - timedelta(seconds=stale_after_s))
                            | Q(heartbeat_at__isnull=True) | Q(deadline_at__lt=hard_limit_passed))
                    .order_by("heartbeat_at")[:limit])
        outcomes: list[Outcome] = []
        for run in dead:
            if run.deadline_at is not None and run.deadline_at < hard_limit_passed:
                error = f"timed out after {run.job.timeout_s} s (worker stopped responding)"
                outcomes.append(Outcome(run, JobRun.Status.TIMED_OUT, None, error))
                result.timed_out += 1
            else:
                seen = run.heartbeat_at.isoformat() if run.heartbeat_at else "never"
                error = f"worker lost: {run.worker or 'unknown'} stopped heartbeating (last {seen})"
                outcomes.append(Outcome(run, JobRun.Status.FAILED, None, error))
                result.lost += 1
            if run.started_at is not None:
                outcomes[-1].duration_ms = int((now - run.started_at).total_seconds() * 1000)
        result.retried = record(outcomes, now=now, send=send).count("retry")
    due = Q(not_before__isnull=True) | Q(not_before__lte=now)
    # Never sent (the sender died between commit and send), or sent and not taken in minutes (the broker lost it).
    # A retry's row is old by created_at, but its mark follows its commit by milliseconds.
    unsent = Q(enqueued_at__isnull=True, created_at__lt=now - timedelta(seconds=unsent_after_s))
    # A retry's message is held back until not_before (countdown): its age counts from then, not from its send.
    long_ago = now - timedelta(seconds=reenqueue_after_s)
    lost = Q(enqueued_at__lt=long_ago) & (Q(not_before__isnull=True) | Q(not_before__lt=long_ago))
    lost_messages = list(JobRun.objects.filter(due, unsent | lost, status=JobRun.Status.PENDING)
                         .values_list("pk", "job__timeout_s")[:limit])
    if lost_messages:
        # Sent, then marked: a send that fails (broker down) leaves them as they were, resent at the next reap.
        send_and_mark([Ticket(pk, timeout_s) for pk, timeout_s in lost_messages], send)
        result.resent = len(lost_messages)
    return result
