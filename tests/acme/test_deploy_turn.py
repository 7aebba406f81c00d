"""deploy.turn: one ACME deployment at a time per fleet, across workers (PostgreSQL session advisory locks)."""

from __future__ import annotations

import threading
import time

import pytest
from django.db import connection, connections

from apps.acme import deploy

pytestmark = [pytest.mark.django_db(transaction=True)]


def test_a_second_deployment_of_a_fleet_waits_for_its_turn_and_other_fleets_do_not() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks are PostgreSQL's (SQLite serialises writers by itself)")
    entered: dict[str, float] = {}
    holding = threading.Event()

    def deployment(name: str, fleets: list[int], hold_s: float) -> None:
        try:
            with deploy.turn(fleets):
                entered[name] = time.monotonic()
                holding.set()
                time.sleep(hold_s)
        finally:
            connections.close_all()

    first = threading.Thread(target=deployment, args=("first", [1, 2], 1.0))
    first.start()
    assert holding.wait(10)
    started = time.monotonic()
    others = [threading.Thread(target=deployment, args=("same", [2, 3], 0.0)),
              threading.Thread(target=deployment, args=("other", [4], 0.0))]
    for thread in others:
        thread.start()
    for thread in (first, *others):
        thread.join(15)
    assert entered["other"] - started < 0.5  # another fleet: no wait
    assert entered["same"] - entered["first"] >= 0.9  # fleet 2 was busy: after the first left


def _advisory_locks_held() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()")
        return cur.fetchone()[0]


def test_a_turn_is_given_back_on_leaving_even_on_an_error() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("advisory locks are PostgreSQL's")
    with deploy.turn([7, 8]):
        assert _advisory_locks_held() == 2
    assert _advisory_locks_held() == 0
    with pytest.raises(RuntimeError), deploy.turn([7]):
        raise RuntimeError("the rollout failed")
    assert _advisory_locks_held() == 0  # session locks outlive transactions: released by hand
