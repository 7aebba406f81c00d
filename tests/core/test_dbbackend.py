"""The health check before each request and task (apps.core.dbbackend): an idle connection is checked without a
statement reaching PostgreSQL, and one the server dropped is still found and replaced. What the server saw is read
from pg_stat_activity on a second connection: a backend's `query` is the last statement it received."""

from __future__ import annotations

import select

import psycopg
import pytest
from django.conf import settings
from django.db import connection, connections

from apps.core.dbbackend.base import DatabaseWrapper
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)  # outside a test transaction, as a request's connection is


def _observer() -> psycopg.Connection:
    db = settings.DATABASES["default"]
    return psycopg.connect(host=db["HOST"] or None, port=db["PORT"] or None, user=db["USER"],
                           password=db["PASSWORD"] or None, dbname=connection.settings_dict["NAME"], autocommit=True)


def _last_statement(observer: psycopg.Connection, pid: int) -> str | None:
    row = observer.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    return None if row is None else row[0]


def _check() -> None:
    """What Django does at a request's (or, in controlplane/celery.py, a task's) start, then at its first query."""
    connection.close_if_unusable_or_obsolete()
    connection.close_if_health_check_failed()


def test_an_idle_connection_is_checked_without_a_statement_and_one_the_server_ended_is_replaced() -> None:
    assert isinstance(connections["default"], DatabaseWrapper) and connection.health_check_enabled
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'the last statement before the check'")
        pid = connection.connection.info.backend_pid
    with _observer() as observer:
        _check()
        assert connection.connection is not None and connection.connection.info.backend_pid == pid  # kept
        assert _last_statement(observer, pid) == "SELECT 'the last statement before the check'"  # nothing sent

        observer.execute("SELECT pg_terminate_backend(%s)", [pid])
        assert wait_for(lambda: _last_statement(observer, pid) is None, 10)
        _check()
        assert connection.connection is None  # found dropped before any query of the request failed on it
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            assert cursor.fetchone() == (1,)
        assert connection.connection.info.backend_pid != pid


def test_a_connection_with_something_waiting_on_it_is_asked_as_before() -> None:
    """A notification (or any message) waiting on the socket could be the server's goodbye: asked with SELECT 1,
    and kept when it answers."""
    with connection.cursor() as cursor:
        cursor.execute("LISTEN spillway_health_check_test")
        pid = connection.connection.info.backend_pid
    with _observer() as observer:
        observer.execute("NOTIFY spillway_health_check_test")
        fd = connection.connection.fileno()
        assert wait_for(lambda: select.select([fd], [], [], 0)[0], 10)  # delivered to the socket (asynchronously)
        _check()
        assert connection.connection is not None and connection.connection.info.backend_pid == pid
        assert _last_statement(observer, pid) == "SELECT 1"
    with connection.cursor() as cursor:
        cursor.execute("UNLISTEN *")


def test_a_connection_inside_a_transaction_is_asked_as_before() -> None:
    with connection.cursor() as cursor:
        cursor.execute("SELECT 'before'")
        pid = connection.connection.info.backend_pid
    with _observer() as observer:
        connection.connection.execute("BEGIN")  # left open on the raw connection, as a crashed caller could
        try:
            connection.health_check_done = False
            assert connection.is_usable()
            assert _last_statement(observer, pid) == "SELECT 1"
        finally:
            connection.connection.execute("ROLLBACK")
