"""Wake parked requests across processes: a Redis pub/sub message per event kind, or a file without Redis.

A worker that changes what a parked request waits for (a node recorded a new applied config) calls
`notify("applied")` after its transaction commits; every web process's ASGI app (controlplane/asgi.py)
listens and re-checks its parked `applied` long-polls at once. With Redis the message goes over pub/sub;
without it (the embedded `make run`, every process on one host) the worker rewrites `wake-<kind>` in
VAR_DIR and each web process looks at its modification time every WAKE_FILE_POLL_S: a stat call, a few
microseconds, once per process whatever the number of parked requests. Parked requests also re-check
periodically, in case a wake-up is lost.
"""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

from django.conf import settings
from django.db import transaction

WAKE_FILE_POLL_S = 0.05

log = logging.getLogger(__name__)

CHANNEL_PREFIX = "spillway:wake:"
_client = None


def channel(kind: str) -> str:
    return CHANNEL_PREFIX + kind


def _publish(kind: str) -> None:
    global _client
    try:
        if _client is None:
            import redis

            _client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=2)
        _client.publish(channel(kind), b"1")
    except Exception:  # a lost wake-up only delays a long-poll to its next periodic re-check
        log.warning("wake-up %s not published", kind, exc_info=True)


def wake_file(kind: str) -> Path:
    return Path(settings.VAR_DIR) / f"wake-{kind}"


def _touch(kind: str) -> None:
    path = wake_file(kind)
    try:
        temp = path.with_suffix(f".{os.getpid()}.tmp")
        temp.write_text(str(time.time_ns()))
        os.replace(temp, path)  # a new inode and modification time each time, seen at the next look
    except OSError:  # a lost wake-up only delays a long-poll to its next periodic re-check
        log.warning("wake-up %s not written", kind, exc_info=True)


def file_stamp(kind: str) -> int:
    """What a watcher compares: the wake file's modification time (0 when there is none yet)."""
    try:
        return os.stat(wake_file(kind)).st_mtime_ns
    except OSError:
        return 0


def notify(kind: str) -> None:
    """Publish `kind` once the current transaction commits (at once outside one)."""
    transaction.on_commit(lambda: _publish(kind) if settings.REDIS_URL else _touch(kind))
