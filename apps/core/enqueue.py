"""Queue a Celery task by its registered name.

A service that imported its app's `tasks` module to queue work made a circle (tasks call the services);
the name is all Celery needs (NetBox queues by name: netbox/extras/events.py). Routing
(settings.CELERY_TASK_ROUTES), eager mode in tests and the task's own options still apply: the registered
task's own apply_async sends it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from amqp.exceptions import RecoverableConnectionError as StaleChannel
from celery import Task, current_app
from kombu.exceptions import OperationalError as BrokerUnreachable

from apps.core.errors import REDIS_ERRORS

logger = logging.getLogger(__name__)


BROKER_ERRORS = (BrokerUnreachable, *REDIS_ERRORS)
# Celery's autodiscovery runs once (a promise): a second thread calling import_default_modules while the first was
# still importing the tasks modules returned at once and found the task missing (NotRegistered): a web process just
# started answered a saved write with a 500 (bench-chaos).
_IMPORT_LOCK = threading.Lock()


def enqueue(name: str, *args: Any, **options: Any) -> bool:
    """`name` as in `@shared_task(name=...)`; options as apply_async's (countdown, expires, producer, ...).

    False when the broker cannot be reached (Redis restarting, down): the caller's work is saved already (tasks
    are queued after a commit) and each kind has a level-triggered safety net that finds it (the periodic converge,
    the events sweep, the jobs dispatcher). Failing the request instead answered a 500 for a saved write, which a
    client retrying would write twice. Sending gives up after settings.CELERY_TASK_PUBLISH_RETRY_POLICY.
    True when sent."""
    task = _task(name)
    try:
        for attempt in (1, 2):
            with current_app.producer_or_acquire() as producer:
                try:
                    task.apply_async(args, producer=producer, **options)
                    return True
                except StaleChannel as exc:
                    if attempt == 2:
                        raise BrokerUnreachable(f"channel closed: {exc}") from exc
                    logger.warning("task %s: the pooled broker connection's channel was closed (%s): connecting anew",
                                   name, exc)
                    # Before, this publish raised (a 500 for a write already saved, its task never queued). The
                    # connection keeps the closed channel as its default one: forget it (closing it again raises in
                    # the Redis transport, its connection gone) and drop the connection; the next use connects.
                    connection = producer.__connection__
                    connection._default_channel = None
                    connection.collect()
    except BROKER_ERRORS as exc:
        logger.warning("task %s not queued, the broker is unreachable (%s): left to its periodic safety net",
                       name, exc)
        return False
    return True


def _task(name: str) -> Task:
    try:
        return current_app.tasks[name]
    except KeyError:
        # A web process has not imported the apps' tasks modules (a worker does at start): the app's
        # autodiscovery imports them all once, on the first task queued by name.
        with _IMPORT_LOCK:
            current_app.loader.import_default_modules()
        return current_app.tasks[name]
