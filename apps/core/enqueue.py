"""Queue a Celery task by its registered name.

A service that imported its app's `tasks` module to queue work made a circle (tasks call the services);
the name is all Celery needs (NetBox queues by name: netbox/extras/events.py). Routing
(settings.CELERY_TASK_ROUTES), eager mode in tests and the task's own options still apply: the registered
task's own apply_async sends it.
"""

from __future__ import annotations

from typing import Any

from celery import Task, current_app
from celery.result import AsyncResult


def enqueue(name: str, *args: Any, **options: Any) -> AsyncResult:
    """`name` as in `@shared_task(name=...)`; options as apply_async's (countdown, expires, producer, ...)."""
    return _task(name).apply_async(args, **options)


def _task(name: str) -> Task:
    try:
        return current_app.tasks[name]
    except KeyError:
        # A web process has not imported the apps' tasks modules (a worker does at start): the app's
        # autodiscovery imports them all once, on the first task queued by name.
        current_app.loader.import_default_modules()
        return current_app.tasks[name]
