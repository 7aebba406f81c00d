"""A prefork pool process says when it is done with its last task (controlplane.celery.POOL_PROCESS_LEAVES), and
the suite's worker teardown (tests/processes.stop_celery_workers) returns on that, leaving the worker to exit."""

from __future__ import annotations

import re

import pytest

from apps.balancers.models import Region
from apps.fleets.models import Fleet
from apps.fleets.tasks import reconcile_task
from controlplane.celery import POOL_PROCESS_LEAVES
from tests.processes import reap_leaving
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)
BILLIARD_WAIT_S = 45.0  # past billiard's 30 s wait for its last result to be read


def test_a_stopped_worker_finishes_its_task_its_pool_processes_say_so_and_it_exits_on_its_own(
        celery_worker_factory, tmp_path) -> None:
    fleet = Fleet.objects.create(name="f", region=Region.objects.create(slug="r", name="R"), reconcile_queued=True)
    proc = celery_worker_factory(name="stopper", concurrency=2)
    reconcile_task.delay(fleet.pk)
    assert wait_for(lambda: not Fleet.objects.get(pk=fleet.pk).reconcile_queued, 30)  # the task began

    # A pool process whose last result its worker had not read when the warm shutdown began waits for the worker to
    # read it, up to 300 x 0.1 s (billiard's Worker._ensure_messages_consumed), before it says it leaves: seen about
    # once in 15 runs on a loaded machine. The stop and the reap wait past that, so the test asks "does it exit on its
    # own", not "within the suite's usual 10 s".
    celery_worker_factory.stop(proc, timeout_s=BILLIARD_WAIT_S)

    log = (tmp_path / "celery-stopper.log").read_text()
    assert re.search(r"Task fleets\.reconcile_task\[[0-9a-f-]+\] succeeded", log), log[-3000:]
    left = re.findall(re.escape(POOL_PROCESS_LEAVES) + r" (\d+) \(exit code 0\)", log)
    assert len(set(left)) == 2, log[-3000:]  # both pool processes, each once
    reap_leaving(BILLIARD_WAIT_S)
    assert proc.returncode == 0
