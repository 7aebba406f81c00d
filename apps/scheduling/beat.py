"""Periodic tasks: the dispatcher tick every second and the reaper every five seconds."""

from __future__ import annotations

DISPATCH_EVERY_S = 1.0
REAP_EVERY_S = 5.0
PRUNE_EVERY_S = 3600.0


def register(app) -> None:
    # A tick that waited in the queue longer than a tick is worthless: the next one does its work.
    # `expire_seconds` is read by django-celery-beat's scheduler, `expires` by Celery's own.
    app.add_periodic_task(DISPATCH_EVERY_S, app.signature("scheduling.dispatch_task"),
                          name="scheduling-dispatch", expire_seconds=2, expires=2)
    app.add_periodic_task(REAP_EVERY_S, app.signature("scheduling.reap_task"), name="scheduling-reap",
                          expire_seconds=10, expires=10)
    app.add_periodic_task(PRUNE_EVERY_S, app.signature("scheduling.prune_task"), name="scheduling-prune",
                          expire_seconds=600, expires=600)
