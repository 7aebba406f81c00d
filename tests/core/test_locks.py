"""Leases in the cache (apps.core.locks.cache_lease), as the fleet shard workers, beats and the enforcer hold them,
against the suite's real Redis."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Iterator

import pytest
from django.conf import settings
from django.core.cache import cache

from apps.core.locks import cache_lease, process_gone, process_token

pytestmark = pytest.mark.skipif(not settings.CACHES["default"]["BACKEND"].endswith("RedisCache"),
                                reason="needs the Redis cache (REDIS_URL)")


@pytest.fixture
def key() -> Iterator[str]:
    name = f"test-lease-{uuid.uuid4().hex[:8]}"
    yield name
    cache.delete(name)


def _dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def test_a_lease_whose_holder_process_is_gone_is_taken_at_once_and_a_live_holders_is_not(key: str) -> None:
    """A standby on the holder's host does not wait out the lease of a killed holder (kill -9 ends its process; the
    kernel reaps it); a holder that lives, or that runs on another host, is waited for."""
    live = process_token("live")  # this process: alive
    assert cache_lease(key, live, 30)
    assert not cache_lease(key, process_token("standby"), 30)

    dead = f"{process_token('x').split(':')[0]}:{_dead_pid()}:killed-worker:abcd1234"
    assert process_gone(dead)
    cache.set(key, dead, 30)
    standby = process_token("standby")
    assert cache_lease(key, standby, 30)
    assert cache.get(key) == standby

    elsewhere = f"another-host:{_dead_pid()}:worker:abcd1234"  # a PID here says nothing about another host
    assert not process_gone(elsewhere)
    cache.set(key, elsewhere, 30)
    assert not cache_lease(key, standby, 30)
