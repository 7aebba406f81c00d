"""A worker outlives its broker going away while it holds unacknowledged messages.

kombu 5.7 made such a worker exit ("Unrecoverable error: 'NoneType' object has no attribute 'hostname'") when Redis
went down, and it stayed gone until a supervisor restarted it (controlplane/celery.py says why and what is patched).
A real worker on a real redis-server of the test's own (so it can be killed and started again), a task waiting on
its countdown in the worker (unacknowledged), Redis killed and started again: the worker reconnects and runs the
next task.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery

from tests.netutil import pick_free_port
from tests.waiting import wait_for

pytestmark = [pytest.mark.process, pytest.mark.django_db(transaction=True)]


class OwnRedis:
    def __init__(self, tmp: Path) -> None:
        self.port, self.tmp, self.proc = pick_free_port(), tmp, None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(self.tmp)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        assert wait_for(lambda: subprocess.run(["redis-cli", "-p", str(self.port), "ping"], capture_output=True,
                                               text=True).stdout.strip() == "PONG", 10)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    if shutil.which("redis-server") is None or shutil.which("redis-cli") is None:
        pytest.skip("needs redis-server and redis-cli")
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.kill()


def test_a_worker_holding_a_counted_down_task_reconnects_after_redis_goes_away(own_redis: OwnRedis,
                                                                               celery_worker_factory,
                                                                               tmp_path: Path) -> None:
    # PYTEST_XDIST_WORKER empty: the settings would move the worker to another database index of this Redis.
    worker = celery_worker_factory(name="brokerloss", queues="celery", pool="threads", concurrency=2,
                                   REDIS_URL=own_redis.url, PYTEST_XDIST_WORKER="")
    log = tmp_path / "celery-brokerloss.log"
    # Not the current app: the suite's own tasks must keep sending to the suite's broker.
    sender = Celery("sender", broker=own_redis.url, set_as_current=False)
    try:
        # Held by the worker, unacknowledged, until its countdown ends (as a reconcile retried in 2 s is).
        sender.send_task("fleets.reconcile_task", args=(987654,), queue="celery", countdown=120)
        assert wait_for(lambda: b"received" in log.read_bytes(), 20)

        own_redis.kill()
        assert wait_for(lambda: b"Connection to broker lost" in log.read_bytes(), 20), log.read_text()[-3000:]
        time.sleep(1.0)
        own_redis.start()
        sender.send_task("fleets.reconcile_task", args=(987655,), queue="celery")

        assert wait_for(lambda: log.read_bytes().count(b"succeeded in") >= 1 or worker.poll() is not None, 40)
        text = log.read_text()
        assert worker.poll() is None and "Unrecoverable error" not in text, text[-4000:]
        assert "'missing': True" in text
    finally:
        sender.close()
