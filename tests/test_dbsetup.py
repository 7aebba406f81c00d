"""The suite's flush between transactional tests (tests/dbsetup.fast_flush): every table empty afterwards, whatever
references what, and nothing else changed (sequences go on, as after Django's own TRUNCATE)."""

from __future__ import annotations

import pytest
from django.apps import apps
from django.core.management import call_command
from django.core.management.color import no_style
from django.db import connection

from apps.balancers.models import Member
from tests.factories import MemberFactory, RouteFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _rows() -> dict[str, int]:
    return {model._meta.db_table: model._base_manager.count() for model in apps.get_models()
            if model._meta.managed and not model._meta.proxy}


def test_flush_empties_every_table_of_rows_that_reference_each_other_and_keeps_the_sequences() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the fast flush is PostgreSQL's")
    RouteFactory()  # an org, a user, an LB, a pool, a hostname claim and the route, each referencing the others
    member = MemberFactory()
    before = _rows()
    assert sum(before.values()) >= 8, before

    statements = connection.ops.sql_flush(no_style(), list(before), reset_sequences=False)
    assert "DELETE FROM" in statements[-1] and "TRUNCATE" not in " ".join(statements)
    # As a transactional test's teardown calls it (TransactionTestCase._fixture_teardown).
    call_command("flush", interactive=False, verbosity=0, reset_sequences=False, inhibit_post_migrate=True)

    assert {table: n for table, n in _rows().items() if n} == {}
    assert MemberFactory().pk > member.pk  # the sequence was not reset
    assert Member.objects.count() == 1


def test_a_flush_that_resets_sequences_is_djangos_truncate() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the fast flush is PostgreSQL's")
    statements = connection.ops.sql_flush(no_style(), ["balancers_member"], reset_sequences=True)
    assert statements[0].startswith("TRUNCATE") and "RESTART IDENTITY" in statements[0]


def test_a_flush_of_some_tables_only_is_djangos_truncate_with_its_cascade() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the fast flush is PostgreSQL's")
    statements = connection.ops.sql_flush(no_style(), ["balancers_pool"], allow_cascade=True)
    assert statements[0].startswith("TRUNCATE") and "CASCADE" in statements[0]
