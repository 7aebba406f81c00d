"""Per-principal limits on expensive or blocking endpoints.

- `PrincipalRateThrottle`: DRF's scoped rate throttle keyed by the principal (token or user), so a
  tenant's many tokens are each limited and the limit follows the caller, not its IP. A view opts in
  with `throttle_scope` (rates in REST_FRAMEWORK["DEFAULT_THROTTLE_RATES"]): `preview` runs
  `haproxy -c`, `longpoll` can hold a request thread.
- `park_slot`: under controlplane.asgi (the production server) a long-poll parks in a coroutine and
  holds no thread; LONGPOLL_WAITS_PER_PRINCIPAL bounds how many wait at once per principal.
- `wait_slot`: under a plain WSGI server a long-poll holds a web thread while it waits. At most
  LONGPOLL_SLOTS_PER_PROCESS waits run per web process and LONGPOLL_SLOTS_PER_PRINCIPAL per principal
  across processes (a Redis counter); a request that gets no slot does not wait — it answers the
  current state at once, as when its timeout passes — so slow long-polls cannot take every thread.
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from django.conf import settings
from django.core.cache import cache
from rest_framework.throttling import ScopedRateThrottle


class PrincipalRateThrottle(ScopedRateThrottle):
    def get_cache_key(self, request, view):
        principal = getattr(request, "principal", None)
        ident = principal.actor if principal is not None else self.get_ident(request)
        return self.cache_format % {"scope": self.scope, "ident": ident}


_process_slots = threading.BoundedSemaphore(getattr(settings, "LONGPOLL_SLOTS_PER_PROCESS", 2))
_SLOT_TTL_S = 120  # a crashed process's counts expire; a wait lasts at most 60 s


@contextmanager
def wait_slot(principal) -> Iterator[bool]:
    """Yield True if the caller may block waiting, False if it must answer now."""
    if not _process_slots.acquire(blocking=False):
        yield False
        return
    key = f"longpoll:{principal.actor}"
    try:
        cache.add(key, 0, _SLOT_TTL_S)
        held = cache.incr(key)
        # Every wait renews the count's lifetime: `add` sets it only for the first of back-to-back waits,
        # and a count expiring during a wait made its `decr` fail (a 500 after two minutes of long-polls).
        cache.touch(key, _SLOT_TTL_S)
        try:
            yield held <= settings.LONGPOLL_SLOTS_PER_PRINCIPAL
        finally:
            with contextlib.suppress(ValueError):  # expired anyway (a Redis restart): nothing left to give back
                cache.decr(key)
    finally:
        _process_slots.release()


# Headers between a parking view and controlplane.asgi (which strips them from every answer).
PARK_HEADER = "X-Spillway-Park"
RELEASE_HEADER = "X-Spillway-Park-Release"


def park_slot(principal) -> str | None:
    """Count one parked long-poll for `principal` (across processes); the counter's cache key, which
    controlplane.asgi decrements when the wait ends, or None when the principal has its share."""
    # A digest: the key travels in a header to controlplane.asgi, and an actor may hold any character.
    key = "longpoll-parked:" + hashlib.sha256(principal.actor.encode()).hexdigest()[:24]
    cache.add(key, 0, _SLOT_TTL_S)
    if cache.incr(key) > settings.LONGPOLL_WAITS_PER_PRINCIPAL:
        cache.decr(key)
        return None
    return key
