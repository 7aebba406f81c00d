"""Wake parked requests across processes: a Redis pub/sub message per event kind.

A worker that changes what a parked request waits for (a node recorded a new applied config) calls
`notify("applied")` after its transaction commits; every web process's ASGI app (controlplane/asgi.py)
listens on the channel and re-checks its parked `applied` long-polls at once. Without Redis (the
SQLite `make run`) nothing is published and parked requests fall back to their periodic re-check.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.db import transaction

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


def notify(kind: str) -> None:
    """Publish `kind` once the current transaction commits (at once outside one)."""
    if settings.REDIS_URL:
        transaction.on_commit(lambda: _publish(kind))
