"""A process whose pooled broker connection had its channel closed under it (what kombu does to the channel of a
connection lost mid-publish: a commit on the embedded broker refused with "database is locked", a Redis restart)
queues its next tasks on a new one. Before, with the embedded broker, the next write of that web process was saved
and then answered 500 (seen in `make run`: a member PATCH), and the reconcile it asked for was never queued (kombu
recovered for the writes after it). Redis's transport recovered on its own; the same check holds it to that."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys

import pytest
import redis
from django.conf import settings

from tests.processes import REPO

pytestmark = pytest.mark.process

CHILD = """
import django
django.setup()
from controlplane.celery import app
from apps.core.enqueue import enqueue
print(enqueue("fleets.reconcile_task", 1))
with app.producer_or_acquire() as producer:
    channel = producer.channel
    channel.close()  # as kombu closes the channels of a connection it lost
    channel._session = None  # the embedded broker's, as seen after "database is locked" (Redis's has none)
print(enqueue("fleets.reconcile_task", 2), enqueue("fleets.reconcile_task", 3))
"""


def _queued_on_redis(url: str) -> int:
    client = redis.Redis.from_url(url)
    return sum(client.llen(key) for key in client.keys("fleets.*") if client.type(key) == b"list")


@pytest.mark.parametrize("broker", ["embedded", "redis"])
def test_a_channel_closed_under_the_pool_is_replaced_and_every_task_is_queued(broker, tmp_path) -> None:
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "controlplane.settings", "CELERY_TASK_ALWAYS_EAGER": "0",
           "SPILLWAY_VAR_DIR": str(tmp_path)}
    if broker == "embedded":
        env["REDIS_URL"] = ""
    else:
        assert settings.REDIS_URL, "make test sets REDIS_URL"  # this test worker's database, as the child's
        redis.Redis.from_url(settings.REDIS_URL).delete(*[f"fleets.{n}" for n in range(8)])
    child = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                           timeout=60)
    assert child.stdout.split() == ["True", "True", "True"], child.stderr[-3000:]
    if broker == "embedded":  # the broker's own table: all three messages are there to be consumed
        assert "channel was closed (channel disconnected): connecting anew" in child.stderr
        with sqlite3.connect(tmp_path / "broker.sqlite3") as db:
            assert db.execute("SELECT count(*) FROM kombu_message WHERE visible = 1").fetchone() == (3,)
    else:
        assert _queued_on_redis(settings.REDIS_URL) == 3
        redis.Redis.from_url(settings.REDIS_URL).delete(*[f"fleets.{n}" for n in range(8)])
