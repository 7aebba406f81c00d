"""Named transaction-scoped locks, and leases held in the cache.

PostgreSQL gets an advisory lock held until the transaction ends; SQLite already
serialises writers (transaction_mode IMMEDIATE), so nothing more is needed there.
"""

from __future__ import annotations

import logging
import zlib

from django.core.cache import cache
from django.db import connection

logger = logging.getLogger(__name__)


def xact_lock(name: str) -> None:
    if connection.vendor != "postgresql":
        return
    key = zlib.crc32(name.encode()) & 0x7FFFFFFF
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def cache_lease(key: str, token: str, timeout_s: float) -> bool:
    """Take or renew the lease `key` for `token` (it lasts `timeout_s` unless renewed); False while another token
    holds it. The cache is the broker's Redis in production: when it cannot be reached, the answer is False (a
    holder stops, a standby keeps waiting), since nothing could be sent through the broker either."""
    try:
        if cache.add(key, token, timeout=timeout_s):
            return True
        if cache.get(key) == token:
            cache.touch(key, timeout=timeout_s)
            # Renewed after the check: a standby may have taken it in between (the key expired). Read again.
            return cache.get(key) == token
    except Exception as exc:  # any cache error means "not held"
        logger.warning("lease %s unreachable (%s)", key, exc)
    return False
