"""The suite's flush between transactional tests (tests/dbsetup.fast_flush): every table empty afterwards, whatever
references what, but the content types and permissions, which are as post_migrate writes them; and nothing else
changed (sequences go on, as after Django's own TRUNCATE)."""

from __future__ import annotations

import weakref

import pytest
from django.apps import apps
from django.contrib.auth.models import Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.core.management.color import no_style
from django.core.management.sql import emit_post_migrate_signal
from django.db import connection
from django.db.models.signals import post_migrate

from apps.balancers.models import Member
from tests.dbsetup import POST_MIGRATE_TABLES
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

    assert {table: n for table, n in _rows().items() if n and table not in POST_MIGRATE_TABLES} == {}
    assert MemberFactory().pk > member.pk  # the sequence was not reset
    assert Member.objects.count() == 1


def _post_migrate_rows() -> set[tuple[str, ...]]:
    return ({("type", *ct) for ct in ContentType.objects.values_list("id", "app_label", "model")}
            | {("perm", *p) for p in Permission.objects.values_list("id", "content_type_id", "codename")})


def test_a_teardown_flush_keeps_what_post_migrate_writes_and_does_not_send_it() -> None:
    """The flush keeps the content types and permissions and skips post_migrate: safe only while its receivers are
    contenttypes' and auth's (a new one, say an app seeding rows after migrate, fails here) and while what they
    keep is what they would write."""
    if connection.vendor != "postgresql":
        pytest.skip("the fast flush is PostgreSQL's")
    refs = [entry[1] for entry in post_migrate.receivers]
    receivers = {f"{receiver.__module__}.{receiver.__qualname__}"
                 for receiver in (ref() if isinstance(ref, weakref.ReferenceType) else ref for ref in refs)}
    assert receivers == {"django.contrib.contenttypes.management.create_contenttypes",
                         "django.contrib.auth.management.create_permissions"}
    sent: list[str] = []
    post_migrate.connect(lambda **kw: sent.append(kw["app_config"].label), weak=False, dispatch_uid="t")
    try:
        before = _post_migrate_rows()
        assert len([row for row in before if row[0] == "perm"]) > 100
        call_command("flush", interactive=False, verbosity=0, reset_sequences=False)  # as the teardown calls it
        assert sent == []
        assert _post_migrate_rows() == before
        emit_post_migrate_signal(0, False, connection.alias)  # what the receivers write: nothing new, nothing else
        assert sent and _post_migrate_rows() == before
    finally:
        post_migrate.disconnect(dispatch_uid="t")


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


def test_a_truncate_after_a_flush_that_kept_the_rows_still_sends_post_migrate() -> None:
    if connection.vendor != "postgresql":
        pytest.skip("the fast flush is PostgreSQL's")
    sent: list[str] = []
    post_migrate.connect(lambda **kw: sent.append(kw["app_config"].label), weak=False, dispatch_uid="t2")
    try:
        # Kept the rows, and asked for no signal: nothing sent.
        call_command("flush", interactive=False, verbosity=0, reset_sequences=False, inhibit_post_migrate=True)
        assert sent == []
        # Django's TRUNCATE (sequences reset) empties the content types: post_migrate writes them again.
        call_command("flush", interactive=False, verbosity=0, reset_sequences=True)
        assert sent
        assert ContentType.objects.exists() and Permission.objects.exists()
    finally:
        post_migrate.disconnect(dispatch_uid="t2")
