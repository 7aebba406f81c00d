"""apps.core.commits.asynchronous_commit: the fleet engine's bookkeeping commits without waiting for the WAL flush, only
inside the block; what it writes is visible to other sessions at once (the `applied` long-polls read it)."""

from __future__ import annotations

import pytest
from django.db import connection, connections, transaction

from apps.balancers.models import Region
from apps.core.commits import asynchronous_commit
from apps.fleets.models import Fleet


def _setting() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW synchronous_commit")
        return cursor.fetchone()[0]


@pytest.mark.django_db(transaction=True)
def test_only_the_block_commits_without_waiting_and_its_writes_are_seen_at_once() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")
    assert _setting() == "on"
    region = Region.objects.create(slug="fc", name="fc")
    with asynchronous_commit():
        assert _setting() == "off"
        fleet = Fleet.objects.create(name="fast", region=region)
    assert _setting() == "on"  # SET LOCAL: this transaction only
    other = connections.create_connection("default")
    try:
        with other.cursor() as cursor:
            cursor.execute(f"SELECT name FROM {Fleet._meta.db_table} WHERE id = %s", [fleet.pk])  # noqa: S608
            assert cursor.fetchone() == ("fast",)
    finally:
        other.close()


@pytest.mark.django_db(transaction=True)
def test_inside_a_callers_transaction_the_block_joins_it_as_it_is() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("synchronous_commit is PostgreSQL's")
    with transaction.atomic(), asynchronous_commit():
        assert _setting() == "on"
