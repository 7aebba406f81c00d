"""Named transaction-scoped locks.

PostgreSQL gets an advisory lock held until the transaction ends; SQLite already
serialises writers (transaction_mode IMMEDIATE), so nothing more is needed there.
"""

from __future__ import annotations

import zlib

from django.db import connection


def xact_lock(name: str) -> None:
    if connection.vendor != "postgresql":
        return
    key = zlib.crc32(name.encode()) & 0x7FFFFFFF
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [key])
