"""Named transaction-scoped locks, and leases held in the cache.

PostgreSQL gets an advisory lock held until the transaction ends; SQLite already
serialises writers (transaction_mode IMMEDIATE), so nothing more is needed there.
"""

from __future__ import annotations

import logging
import os
import uuid
import zlib
from pathlib import Path

from django.core.cache import cache
from django.db import connection

logger = logging.getLogger(__name__)


def xact_lock(name: str) -> None:
    if connection.vendor != "postgresql":
        return
    key = zlib.crc32(name.encode()) & 0x7FFFFFFF
    with connection.cursor() as cur:
        cur.execute("SELECT pg_advisory_xact_lock(%s)", [key])


def process_token(label: str) -> str:
    """A lease holder's token: this host and process, `label` (what a person reads), and a random part."""
    return f"{os.uname().nodename}:{os.getpid()}:{label}:{uuid.uuid4().hex[:8]}"


def _token_pid_here(token: str) -> int | None:
    """The PID a process_token names when it was made on this host, else None."""
    host, _, rest = token.partition(":")
    pid_text = rest.partition(":")[0]
    return int(pid_text) if host == os.uname().nodename and pid_text.isdigit() else None


def made_by_this_process(token: str) -> bool:
    return _token_pid_here(token) == os.getpid()


def process_gone(token: str) -> bool:
    """The holder named by a process_token ran on this host, in another process, and that process no longer exists
    (or is a zombie: a killed worker whose parent died too lingers until reaped). False when that cannot be told."""
    pid = _token_pid_here(token)
    if pid is None or pid == os.getpid():
        return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] == "Z"


def cache_lease(key: str, token: str, timeout_s: float) -> bool:
    """Take or renew the lease `key` for `token` (it lasts `timeout_s` unless renewed); False while another token
    holds it. The cache is the broker's Redis in production: when it cannot be reached, the answer is False (a
    holder stops, a standby keeps waiting), since nothing could be sent through the broker either.

    A holder whose process on this host is gone (process_gone: its token is a process_token) is not waited for: its
    lease is taken at once, not after `timeout_s`. Two standbys that both see it gone may both clear it; only one
    adds its own (`add` is atomic), and one that clears the other's new lease makes it lose one renewal, no more."""
    try:
        if cache.add(key, token, timeout=timeout_s):
            return True
        holder = cache.get(key)
        if holder == token:
            cache.touch(key, timeout=timeout_s)
            # Renewed after the check: a standby may have taken it in between (the key expired). Read again.
            return cache.get(key) == token
        if isinstance(holder, str) and process_gone(holder) and cache.get(key) == holder:
            cache.delete(key)
            return bool(cache.add(key, token, timeout=timeout_s))
    except Exception as exc:  # any cache error means "not held"
        logger.warning("lease %s unreachable (%s)", key, exc)
    return False
