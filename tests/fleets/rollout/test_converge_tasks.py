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
