"""Reads that must see the database as of one moment.

At PostgreSQL's default READ COMMITTED each statement sees what was committed when it began, so a reader
of several tables can see half of a write that commits between its statements: the fleet render read a
route's targets, then the routes, and a route created in between came out without targets (stored as a
"needs targets" problem on the revision, and left out until the next render).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def one_snapshot() -> Iterator[None]:
    """Every query inside reads the same committed state (REPEATABLE READ, read only, on PostgreSQL).

    Inside a transaction already (a caller's atomic block, a test's) the isolation cannot change any
    more: the block runs as it is. SQLite serialises writers, so a reader never sees half of one."""
    if connection.vendor != "postgresql" or connection.in_atomic_block:
        yield
        return
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        yield
