"""One migrated template database per run, copied by every xdist worker.

pytest-django has each worker create its test database by running every migration: ~8 s of CPU per worker, all
of them at once at the start on a 2-core machine. Here the first worker to take the lock migrates a template and
each worker (the first included) copies it with `CREATE DATABASE … TEMPLATE …`, which takes well under a second.
Copies are made one at a time: PostgreSQL refuses to copy a database another session is using.
"""

from __future__ import annotations

import fcntl
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def _locked(path: Path):
    handle = path.open("a+")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


@pytest.fixture(scope="session")
def django_db_setup(request, django_test_environment, django_db_blocker, django_db_modify_db_settings,
                    django_db_keepdb: bool, worker_id: str, tmp_path_factory) -> Iterator[None]:
    from django.db import connection
    from django.test.utils import setup_databases, teardown_databases

    if worker_id == "master" or django_db_keepdb:  # a serial run, or --reuse-db (make test-fast): Django's own
        with django_db_blocker.unblock():
            config = setup_databases(verbosity=0, interactive=False, keepdb=django_db_keepdb)
        yield
        if not django_db_keepdb:
            with django_db_blocker.unblock():
                teardown_databases(config, verbosity=0)
        return

    shared = tmp_path_factory.getbasetemp().parent  # the same directory for every worker of this run
    original = connection.settings_dict["NAME"]
    mine = connection.settings_dict["TEST"]["NAME"]  # test_<name>_gwN (pytest-django's xdist suffix)
    template = f"test_{original}_template"
    with django_db_blocker.unblock():
        lock = _locked(shared / "test-database.lock")
        try:
            if not (shared / "test-database.template").exists():
                connection.settings_dict["TEST"]["NAME"] = template
                connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
                connection.close()
                (shared / "test-database.template").write_text(template)
            with connection.creation._nodb_cursor() as cursor:
                cursor.execute(f"DROP DATABASE IF EXISTS {_quote(mine)}")
                cursor.execute(f"CREATE DATABASE {_quote(mine)} TEMPLATE {_quote(template)}")
        finally:
            lock.close()
        connection.close()
        connection.settings_dict["TEST"]["NAME"] = mine
        _use_database(connection, mine)
    yield
    with django_db_blocker.unblock():
        try:
            connection.close()
            with connection.creation._nodb_cursor() as cursor:
                # FORCE (PostgreSQL 13+) ends the sessions still on it. In most full runs a worker had one left: a
                # session of its own, idle after a ROLLBACK (pg_stat_activity, read just before the drop), that
                # the close above is not for (another thread's or context's). A plain DROP waited 5 s for it at
                # the very end of the run, failed ("being accessed by other users") and left the database behind.
                cursor.execute(f"DROP DATABASE IF EXISTS {_quote(mine)} WITH (FORCE)")
        except Exception as exc:  # as pytest-django does: a warning, not a failed run
            request.node.warn(pytest.PytestWarning(f"Error when trying to teardown test databases: {exc!r}"))
        finally:
            _use_database(connection, original)


def _use_database(connection: Any, name: str) -> None:
    """Point the connection at `name`, and settings too, as create_test_db and destroy_test_db leave them (tests read
    settings, as Django's own runner sets them)."""
    from django.conf import settings

    connection.settings_dict["NAME"] = name
    settings.DATABASES[connection.alias]["NAME"] = name


def drop_template(config: pytest.Config) -> None:
    """The controller's last step under xdist (tests/conftest.py): no worker is left to use the template."""
    from django.db import connection
    from pytest_django.plugin import blocking_manager_key

    with config.stash[blocking_manager_key].unblock(), connection.creation._nodb_cursor() as cursor:
        cursor.execute(f"DROP DATABASE IF EXISTS {_quote('test_' + connection.settings_dict['NAME'] + '_template')}")


# What the post_migrate receivers write (django.contrib.contenttypes and django.contrib.auth).
POST_MIGRATE_TABLES = frozenset({"django_content_type", "auth_permission"})


def fast_flush() -> None:
    """A transactional test's teardown empties every table (Django's `flush`): on PostgreSQL with one TRUNCATE of
    all ~70 tables, ~0.25 s each time, since TRUNCATE gives every table new files. The tables a test leaves are
    small, and DELETE empties them in ~20 ms, in one statement with the foreign-key triggers off for the
    transaction (session_replication_role: a superuser's setting, which the suite's `postgres` role is). As any
    other role, when sequences are to be reset, or when only some apps' tables are flushed, Django's TRUNCATE runs
    as before. Like that TRUNCATE (no RESTART IDENTITY), it leaves sequences where they are.

    The fast path keeps the content types and permissions: Django's flush deletes them and then sends post_migrate,
    whose two receivers (contenttypes' and auth's, the only ones here: tests/test_dbsetup.py) insert all ~70 content
    types and ~280 permissions again, ~95% of each teardown's time (py-spy over a whole `make test`). Kept, they are
    what those receivers would write, so the signal is not sent after such a flush."""
    from django.core.management.commands import flush
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush
    if getattr(truncate, "spillway_fast", False):
        return
    emit_post_migrate = flush.emit_post_migrate_signal

    def sql_flush(self: DatabaseOperations, style: Any, tables: list[str], *, reset_sequences: bool = False,
                  allow_cascade: bool = False) -> list[str]:
        # allow_cascade: a flush of only some apps' tables (TestCase.available_apps), where TRUNCATE's CASCADE
        # also empties the tables referencing them and a DELETE with the triggers off would leave those dangling.
        if not tables or reset_sequences or allow_cascade or not _superuser(self.connection):
            # Set on every flush: one that kept the rows but sent no signal (inhibit_post_migrate) must not make a
            # later TRUNCATE, which empties them, skip the signal that writes them again.
            self.connection.spillway_flush_kept = False
            return truncate(self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade)
        # Django's own table names (introspection), quoted as its TRUNCATE quotes them.
        deletes = " ".join(f"DELETE FROM {self.quote_name(table)};"  # noqa: S608
                           for table in tables if table not in POST_MIGRATE_TABLES)
        self.connection.spillway_flush_kept = POST_MIGRATE_TABLES.issubset(tables)
        return ["SET LOCAL session_replication_role = replica", f"DO $$BEGIN {deletes} END$$"]

    def emit_unless_kept(verbosity: int, interactive: bool, db: str, **kwargs: Any) -> None:
        from django.db import connections

        connection = connections[db]
        kept, connection.spillway_flush_kept = getattr(connection, "spillway_flush_kept", False), False
        if not kept:
            emit_post_migrate(verbosity, interactive, db, **kwargs)

    sql_flush.spillway_fast = True  # type: ignore[attr-defined]
    DatabaseOperations.sql_flush = sql_flush  # type: ignore[method-assign]
    flush.emit_post_migrate_signal = emit_unless_kept


def _superuser(connection: Any) -> bool:
    known = getattr(connection, "spillway_superuser", None)
    if known is None:
        with connection.cursor() as cursor:
            cursor.execute("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")
            known = connection.spillway_superuser = bool(cursor.fetchone()[0])
    return known
