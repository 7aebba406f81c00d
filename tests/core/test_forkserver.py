"""The suite's workers and commands fork from a preloaded Python (tests/forkserver.py, tests/processes.start_python),
one per environment: a forked worker must run tasks against the test database like a cold one, report its exit as
Popen would, and never carry settings read under another environment."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from apps.balancers.models import Region
from apps.fleets.models import Fleet
from apps.fleets.tasks import reconcile_task
from tests.processes import ForkedProcess
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_forked_worker_runs_tasks_on_the_test_database_and_its_death_reads_as_popens(celery_worker_factory) -> None:
    fleet = Fleet.objects.create(name="f", region=Region.objects.create(slug="r", name="R"), reconcile_queued=True)
    celery_worker_factory(name="maybe-cold", queues="acme")  # the first under an environment may start cold
    first = celery_worker_factory(name="forked-1", concurrency=2)
    second = celery_worker_factory(name="forked-2", pool="threads")
    assert isinstance(first, ForkedProcess) and isinstance(second, ForkedProcess)
    assert first.pid != second.pid and first.pid not in (os.getpid(), os.getppid())

    reconcile_task.delay(fleet.pk)
    assert wait_for(lambda: not Fleet.objects.get(pk=fleet.pk).reconcile_queued, 30)  # a worker took it, in the DB

    os.kill(second.pid, signal.SIGKILL)
    assert second.wait(5) == -signal.SIGKILL
    assert second.poll() == -signal.SIGKILL
    assert first.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        first.wait(0.05)


def test_a_worker_under_another_environment_never_comes_from_a_server_that_imported_under_this_one(
        celery_worker_factory, tmp_path) -> None:
    # Settings are read at import: forked from the plain workers' server, it would keep that server's.
    plain = [celery_worker_factory(name=f"plain-{n}", queues="acme") for n in range(2)]
    tuned = [celery_worker_factory(name=f"tuned-{n}", queues="events", EVENTS_TIMEOUT_S="3") for n in range(2)]
    assert isinstance(plain[1], ForkedProcess) and "EVENTS_TIMEOUT_S" not in plain[1].server.env
    assert isinstance(tuned[0], subprocess.Popen) or tuned[0].server.env["EVENTS_TIMEOUT_S"] == "3"
    assert isinstance(tuned[1], ForkedProcess) and tuned[1].server.env["EVENTS_TIMEOUT_S"] == "3"
    assert all(b"ready." in (tmp_path / f"celery-{name}.log").read_bytes()
               for name in ("plain-0", "plain-1", "tuned-0", "tuned-1"))


def test_a_forked_child_starts_with_the_heap_it_inherited_out_of_the_collectors_reach(tmp_path) -> None:
    """The server freezes its heap before it forks (Python's advice for fork without exec): a child's full
    collections, the worker's startup freeze among them, walk only what it built itself, not the ~170k objects of
    Django, Celery and the apps it inherited (~155 ms of CPU per child here), and touch none of the pages it shares
    with the server. A cold start has nothing frozen until it freezes its own."""
    from tests.processes import process_env, start_python

    # An environment of this test's own: its first start runs cold, its second comes from a server started for it.
    env = process_env(SPILLWAY_FORKSERVER_PROBE="frozen-heap")
    frozen = "import gc; print('frozen objects:', gc.get_freeze_count())"
    counts = []
    for start in ("cold", "forked"):
        log = tmp_path / f"{start}.log"
        proc = start_python(["manage.py", "shell", "-c", frozen], env, log)
        assert proc.wait(60) == 0, log.read_text()[-2000:]
        counts.append(int(log.read_text().rsplit("frozen objects:", 1)[1].split()[0]))
    cold, forked = counts
    assert cold == 0
    assert forked > 100_000
