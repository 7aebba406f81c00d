"""Celery beat with standbys: several beat processes may run, and the one holding a lease sends the schedule.

django-celery-beat's DatabaseScheduler keeps the schedule in the database, but every beat process sends every
due task: two beats doubled every periodic task, so beat had to be a singleton, and with it killed nothing
periodic ran (no converge, no health, no scheduled jobs) until a human restarted it. Here a beat sends only
while it holds a lease in the cache (the broker's Redis in production, as the enforcer's and the fleet shards'
leases); the others tick every RENEW_S and take the lease within LEASE_S + RENEW_S of the leader's death.
A new leader reads the schedule again from the database (what the last one sent), and every periodic task is
idempotent, so a task sent twice around a takeover costs one more run, never a wrong result. Scheduled jobs
are not beat's slots: the dispatcher it ticks claims each job's slot in the database (apps.scheduling).
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

from django.core.cache import cache
from django_celery_beat.schedulers import DatabaseScheduler

from apps.core.locks import cache_lease

logger = logging.getLogger(__name__)

LEASE_S = 5
RENEW_S = 1.0
KEY = "spillway:beat-leader"


class LeaderScheduler(DatabaseScheduler):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.token = f"{os.uname().nodename}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.leading: bool | None = None
        super().__init__(*args, **kwargs)

    def _lead(self) -> bool:
        return cache_lease(KEY, self.token, LEASE_S)

    def tick(self, *args: Any, **kwargs: Any) -> float:
        leading = self._lead()
        if leading != self.leading:
            if leading:
                logger.warning("beat: this beat (%s) leads and sends the schedule", self.token)
                # Read every entry's last run again: the last leader sent what this process never saw.
                self._initial_read, self._heap = True, None
            else:
                logger.warning("beat: another beat leads (or the lease cannot be read); this one stands by")
            self.leading = leading
        if not leading:
            return RENEW_S
        return min(super().tick(*args, **kwargs), RENEW_S)

    def close(self) -> None:
        try:
            if cache.get(KEY) == self.token:
                cache.delete(KEY)  # a standby leads at once after a clean stop
        except Exception:  # noqa: S110 (the lease expires by itself)
            pass
        super().close()
