"""The periodic converge (beat, every 10 s) never piles up on a fleet's shard: a converge still running when
the next tick's arrives skips that one, and one still queued at the next tick is dropped (expires)."""

from __future__ import annotations

import threading

import pytest
from django.db import connection

from apps.fleets import services, tasks
from apps.fleets.beat import CONVERGE_EVERY_S
from apps.fleets.models import Fleet

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_second_converge_of_a_fleet_skips_while_the_first_runs_and_runs_after_it(monkeypatch, shared) -> None:
    fleet: Fleet = shared["fleet"]
    entered, release = threading.Event(), threading.Event()
    calls: list[int] = []

    def slow_converge(*, fleet, enqueue=True):  # type: ignore[no-untyped-def]
        calls.append(fleet.pk)
        entered.set()
        release.wait(10)

    monkeypatch.setattr(services, "fleet_converge", slow_converge)
    first: list[dict] = []

    def run_first() -> None:
        try:
            first.append(tasks.converge_fleet_task(fleet.pk))
        finally:
            connection.close()

    runner = threading.Thread(target=run_first)
    runner.start()
    try:
        assert entered.wait(10)
        assert tasks.converge_fleet_task(fleet.pk) == {"skipped": "a converge of this fleet is running"}
        assert calls == [fleet.pk]
    finally:
        release.set()
        runner.join(10)
    assert first == [{}]
    tasks.converge_fleet_task(fleet.pk)  # the fleet's next converge runs again
    assert calls == [fleet.pk, fleet.pk]


def test_each_tick_queues_a_converge_per_fleet_that_expires_by_the_next_tick(monkeypatch, shared) -> None:
    sent: list[tuple[tuple, dict]] = []
    monkeypatch.setattr(tasks.converge_fleet_task, "apply_async",
                        lambda args, **options: sent.append((args, options)))

    assert tasks.converge_task() == {"fleets": 1}

    assert sent == [((shared["fleet"].pk,), {"expires": CONVERGE_EVERY_S})]


def test_a_reconcile_the_database_failed_under_is_run_again(monkeypatch, shared) -> None:
    """A reconcile that loses the database (restarted, failed over) is retried by Celery 2 s later, not left to the
    next converge: the changes written just before the fault go live once the database is back.

    The database error is injected (OperationalError); the task runs in this process (apply), where Celery records
    the retry it would send to the broker. bench-chaos shows it against a real restart (its postgres phase)."""
    from celery import states
    from celery.exceptions import Retry
    from django.db import OperationalError

    fleet: Fleet = shared["fleet"]
    sent: list[dict] = []

    def failing(*, fleet_id):  # type: ignore[no-untyped-def]
        raise OperationalError("server closed the connection unexpectedly")

    def retry_sent(*args, **options):  # type: ignore[no-untyped-def]
        sent.append(options)
        raise Retry("retry", exc=options.get("exc"), when=options.get("countdown"))

    monkeypatch.setattr(services, "fleet_reconcile", failing)
    monkeypatch.setattr(tasks.reconcile_task._get_current_object(), "retry", retry_sent)
    result = tasks.reconcile_task.apply((fleet.pk,), throw=False)

    assert result.state == states.RETRY
    assert [o["countdown"] for o in sent] == [2]
    assert tasks.reconcile_task.max_retries * 2 >= 120  # two minutes of tries


def test_a_converge_the_database_failed_under_hands_the_fleet_to_a_retrying_reconcile(monkeypatch, shared) -> None:
    """A converge that loses the database may have held the fleet's lease, with changes left to it by reconciles that
    found the lease taken: it queues a reconcile (2 s later, retried every 2 s) so they go live once the database is
    back, not at the next converge tick. The database error is injected and what is sent is recorded."""
    from django.db import OperationalError

    fleet: Fleet = shared["fleet"]
    sent: list[tuple] = []

    def failing(fleet_id):  # type: ignore[no-untyped-def]
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(tasks, "_converge_fleet", failing)
    monkeypatch.setattr(tasks, "enqueue", lambda name, *args, **options: sent.append((name, args, options)) or True)
    with pytest.raises(OperationalError):
        tasks.converge_fleet_task(fleet.pk)

    assert sent == [("fleets.reconcile_task", (fleet.pk,), {"countdown": 2})]
