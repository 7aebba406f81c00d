"""Writes that need not wait for the disk: bookkeeping the control plane derives again if it is lost.

At PostgreSQL's default every commit waits until its WAL record is flushed to disk. A route change's rollout
wrote about a dozen such small transactions (lease, revision, rollout and node results, node records, the
rollout's end), each a WAL flush of its own: on the 2-core bench machine, with the nodes' pushes fsyncing
beside them, that was tens of milliseconds of every change's path (py-spy: `_record`'s two bulk updates alone
~23 ms a rollout, nearly all of it the commit).

With `synchronous_commit` off for one transaction, its commit returns once the record is in the WAL buffer;
other sessions see it at once, and the WAL writer flushes it within `wal_writer_delay` (200 ms by default).
A database crash in that window loses the most recent such transactions, never one in the middle: WAL is
written in order, and any later synchronous commit flushes everything before it. What is lost here is the
fleet engine's record of work it does again: an unrecorded rollout is resumed by the converge, a node whose
record fell back is found drifted (its files and worker are not the recorded ones) and re-pushed, a lost lease
expires. What users write through the API (routes, pools, members) is never committed this way.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.db import connection, transaction


@contextmanager
def asynchronous_commit() -> Iterator[None]:
    """The block as one transaction that commits without waiting for the WAL flush (PostgreSQL). Inside a
    transaction already (a caller's atomic block, a test's), the block joins it as it is (a savepoint)."""
    outermost = connection.vendor == "postgresql" and not connection.in_atomic_block
    with transaction.atomic():
        if outermost:
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL synchronous_commit TO OFF")
        yield
