"""A Celery worker keeps its PostgreSQL connection between tasks, as a web process does between requests.

Celery closed every database connection around every task unless told otherwise, so each fleet reconcile
opened a new connection: ~14 ms a task under load in bench-scale's sustained run (py-spy), on the path of
every route change. Now a connection is closed as Django closes a request's: past CONN_MAX_AGE, or unusable.
"""

from __future__ import annotations

import time

import pytest
from django.db import connection

from apps.balancers.models import Region
from apps.fleets.models import Fleet
from apps.fleets.tasks import reconcile_task
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)

APP = "spw-connection-reuse-test"  # the worker's application_name (libpq reads PGAPPNAME)


def _worker_backends() -> list[int]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pid FROM pg_stat_activity WHERE application_name = %s AND datname = current_database()",
                       [APP])
        return [row[0] for row in cursor.fetchall()]


def _one_task(fleet: Fleet) -> None:
    Fleet.objects.filter(pk=fleet.pk).update(reconcile_queued=True)
    reconcile_task.delay(fleet.pk)
    assert wait_for(lambda: not Fleet.objects.get(pk=fleet.pk).reconcile_queued, 30)  # the task began
    time.sleep(1.0)  # and ended (a fleet with nothing to render or roll out)


def test_a_worker_keeps_its_database_connection_between_tasks(celery_worker_factory, settings) -> None:
    if connection.vendor != "postgresql":
        pytest.skip("pg_stat_activity is PostgreSQL's")
    fleet = Fleet.objects.create(name="edge", region=Region.objects.create(slug="us-east", name="US East"))
    celery_worker_factory(name="reuse", queues=",".join(settings.FLEET_QUEUES), pool="threads", concurrency=1,
                          PGAPPNAME=APP)
    _one_task(fleet)
    first = _worker_backends()
    assert len(first) == 1, "the worker closed its connection after the task"
    for _ in range(3):
        _one_task(fleet)
    assert _worker_backends() == first
