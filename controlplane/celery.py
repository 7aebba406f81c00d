"""Celery app, configured from Django settings with the CELERY namespace."""

from __future__ import annotations

import logging
import os

from celery import Celery
from celery.signals import (
    task_postrun,
    task_prerun,
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutting_down,
)
from django.db import close_old_connections

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

logger = logging.getLogger(__name__)
# Logged by a prefork pool process once it is done with its last task (tests/processes.stop_celery_workers reads it).
POOL_PROCESS_LEAVES = "pool process done with its tasks, leaving:"

app = Celery("spillway")
app.config_from_object("django.conf:settings", namespace="CELERY")


def _tune_sqlalchemy_transport() -> None:
    """Poll the embedded SQLite broker quickly, and let a closed channel say so.

    `polling_interval` must not go into broker_transport_options with this
    transport: kombu passes those options to SQLAlchemy's create_engine(), which
    rejects the keyword and crashes the worker. Setting it on the Transport class
    is the measured way.
    """
    if not str(app.conf.broker_url).startswith("sqla+"):
        return
    from amqp.exceptions import RecoverableConnectionError
    from kombu.transport import sqlalchemy as sqla_transport

    sqla_transport.Transport.polling_interval = 0.1
    # A channel its connection closed (a publish that failed on "database is locked") has no connection, and its
    # session is opened through it: AttributeError, a 500 for the write the web process had saved (seen in `make
    # run`). Raised as the closed channel it is (kombu's own error for one), apps.core.enqueue connects anew.
    original = sqla_transport.Channel._open
    if getattr(original, "spillway_patched", False):
        return

    def _open(self):  # type: ignore[no-untyped-def]
        if self.connection is None:
            raise RecoverableConnectionError("channel disconnected")
        return original(self)

    _open.spillway_patched = True  # type: ignore[attr-defined]
    sqla_transport.Channel._open = _open


def _survive_redis_loss_with_unacked_messages() -> None:
    """A worker holding unacknowledged messages (a task retried with a countdown waits in it) exited when Redis went
    away: on the lost connection kombu 5.7 releases the connection, the channel's close then restores those messages
    through a connection whose `client` is already None, and the AttributeError is not one of the connection errors
    celery ignores there: "Unrecoverable error: 'NoneType' object has no attribute 'hostname'" (kombu/transport/
    redis.py `_connparams`), and the worker is gone until its supervisor restarts it (6-16 s of boot on a loaded
    machine, in bench-chaos). Raised as the connection error it is, the close is ignored and the worker reconnects;
    the messages stay in Redis's unacked set (restored after the visibility timeout), or went with Redis."""
    if not str(app.conf.broker_url).startswith(("redis://", "rediss://")):
        return
    import redis
    from kombu.transport import redis as kombu_redis

    original = kombu_redis.Channel._connparams
    if getattr(original, "spillway_patched", False):
        return

    def _connparams(self, asynchronous=False):  # type: ignore[no-untyped-def]
        if self.connection is None or self.connection.client is None:
            raise redis.exceptions.ConnectionError("the broker connection was released")
        return original(self, asynchronous)

    _connparams.spillway_patched = True  # type: ignore[attr-defined]
    kombu_redis.Channel._connparams = _connparams


_tune_sqlalchemy_transport()
_survive_redis_loss_with_unacked_messages()
app.autodiscover_tasks()


@worker_init.connect
def _worker_setup(**kwargs) -> None:
    """The worker's main process, its task modules imported and no pool child forked yet: its long GC pauses logged,
    and its startup heap (Django, Celery, every app module: ~200k objects) left out of full collections. A full
    collection walked all of it while every thread waited: 100-280 ms pauses of the shard workers and the health
    worker during bench-fleet-size's route changes at 201 nodes, each a change's wait. Frozen before the fork, so
    prefork children inherit it without writing to every page they share with their parent."""
    from apps.core import gcpause

    _worker_process_setup()
    gcpause.freeze_startup_heap()


@worker_process_init.connect
def _worker_process_setup(**kwargs) -> None:
    """A worker process logs its long GC pauses and freezes the large route lanes it keeps (routelane._freeze)."""
    from apps.core import gcpause
    from apps.fleets.config import routelane

    gcpause.install()
    routelane.FREEZE = True  # a worker keeps the lanes it renders


@worker_process_shutdown.connect
def _pool_process_leaves(pid: int | None = None, exitcode: int | None = None, **kwargs) -> None:
    """A prefork pool process done with its last task says so (POOL_PROCESS_LEAVES): billiard then keeps it ~1 s
    before it exits, and a warm shutdown waits for that. What waits only for the tasks to end reads the line."""
    logger.info("%s %s (exit code %s)", POOL_PROCESS_LEAVES, pid, exitcode)


@worker_ready.connect
def _fleet_shard_keepers(sender=None, **kwargs) -> None:
    """A worker on a fleet shard queue consumes it only while it holds the queue's lease; two or more workers
    per queue are a primary and its standbys (apps.fleets.rollout.shards)."""
    from apps.fleets import services

    if sender is not None:
        services.shard_keepers_start(sender)


@worker_shutting_down.connect
def _fleet_shard_release(**kwargs) -> None:
    """A worker stopped on purpose hands its queue to a standby at once (a killed one after LEASE_S)."""
    from apps.fleets import services

    services.shard_keepers_stop()


@app.on_after_finalize.connect
def _register_periodic_tasks(sender: Celery, **kwargs) -> None:
    """Each app lists its periodic tasks in apps/<app>/beat.py: `register(app)`."""
    from apps.core.discovery import app_modules

    for module in app_modules("beat"):
        module.register(sender)


@task_prerun.connect
@task_postrun.connect
def _database_connections_as_requests_keep_them(task=None, **kwargs) -> None:
    """Django's rule for a request, around each task: close a connection past CONN_MAX_AGE or left unusable by
    an error, keep the rest. Celery's own rule closed every connection around every task unless
    CELERY_DB_REUSE_MAX was set (settings: then it closes them only every that many tasks). Not for an eager
    task: it runs inside its caller (a request, a test), whose transaction owns the connection."""
    if task is not None and getattr(task.request, "is_eager", False):
        return
    close_old_connections()
