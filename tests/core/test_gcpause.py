"""Long garbage-collection pauses are logged (apps.core.gcpause), so a slow route change can be matched to one; what
is handed to release_later is freed in a thread of its own, in a forked child too."""

from __future__ import annotations

import gc
import logging
import os
import select
import signal
import threading
import time
import weakref

import pytest

from apps.core import gcpause


@pytest.fixture
def installed():
    gcpause.install()
    gcpause.install()  # idempotent
    assert gc.callbacks.count(gcpause._timed) == 1
    yield
    gc.callbacks.remove(gcpause._timed)


def test_a_collection_at_least_slow_ms_long_is_logged_with_its_generation(installed, caplog, monkeypatch) -> None:
    caplog.set_level(logging.WARNING, logger="spillway.gc")
    monkeypatch.setattr(gcpause, "SLOW_MS", 10_000.0)
    gc.collect()
    time.sleep(0.1)
    # Only this logger's: a thread another test left in this worker may log meanwhile (a job runner's heartbeat
    # failing once its test database is gone failed this test in a whole-suite run).
    assert not [r for r in caplog.records if r.name == "spillway.gc"]
    monkeypatch.setattr(gcpause, "SLOW_MS", 0.0)
    cycles = [[] for _ in range(1000)]
    for a, b in zip(cycles, cycles[1:] + cycles[:1], strict=True):
        a.append(b)
    del cycles, a, b
    gc.collect()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not any("generation 2" in r.getMessage() for r in caplog.records):
        time.sleep(0.01)  # logged from gcpause's own thread
    full = [r.getMessage() for r in caplog.records if "generation 2 paused this process for" in r.getMessage()]
    assert len(full) == 1 and int(full[0].rpartition("(")[2].split()[0]) >= 1000, full


def test_the_collector_stays_off_until_the_last_overlapping_pause_ends_and_then_is_on_again() -> None:
    """Two threads' pauses overlapping the way that used to lose it: A in, B in, A out (still off: B parses),
    B out (on again). A pause inside a process whose collector is off leaves it off."""
    import threading

    assert gc.isenabled()
    a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
    seen: dict[str, bool] = {}

    def a() -> None:
        with gcpause.collector_paused():
            a_in.set()
            b_in.wait(5)
        a_out.set()

    def b() -> None:
        a_in.wait(5)
        with gcpause.collector_paused():
            b_in.set()
            a_out.wait(5)
            seen["after A left"] = gc.isenabled()

    threads = [threading.Thread(target=a), threading.Thread(target=b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    assert seen == {"after A left": False} and gc.isenabled()

    gc.disable()
    try:
        with gcpause.collector_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


@pytest.mark.process
def test_a_web_process_leaves_its_startup_heap_out_of_full_collections() -> None:
    """The served application (controlplane.asgi), once the server starts it (ASGI lifespan startup, as gunicorn's
    asgi worker sends after the fork), has imported every view and frozen its heap: a full collection then walks only
    what requests build since (a 54 ms pause of every request thread of the process before; bench-tenants' quiet
    tenant's p99 beside a busy one twice what it is now). Importing the module alone freezes nothing."""
    import subprocess
    import sys

    from tests.processes import REPO, process_env

    code = """
import asyncio, gc, sys
from controlplane.asgi import application
imported = (gc.get_freeze_count(), 'apps.balancers.api.views' in sys.modules)
messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])
sent = []
async def receive():
    return next(messages)
async def send(message):
    sent.append(message["type"])
asyncio.run(application({"type": "lifespan"}, receive, send))
print(*imported, gc.get_freeze_count(), len(gc.get_objects()), 'apps.balancers.api.views' in sys.modules, *sent)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=process_env(DEBUG="0"), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    frozen_at_import, views_at_import, frozen, tracked, views_loaded, *sent = done.stdout.split()
    assert (frozen_at_import, views_at_import) == ("0", "False")  # a test importing the module freezes nothing
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert views_loaded == "True"  # the API's views were imported at start, before the freeze
    assert int(frozen) > 100_000, done.stdout
    assert int(tracked) < int(frozen) // 20, done.stdout  # what a full collection still walks


@pytest.mark.process
def test_a_celery_worker_leaves_its_startup_heap_out_of_full_collections() -> None:
    """A Celery worker freezes its heap once its task modules are imported, in the main process before the pool
    forks (worker_init): the shard workers' full collections walked ~200k objects of Django, Celery and the apps
    while every rollout thread waited (100-280 ms pauses during bench-fleet-size's route changes at 201 nodes).
    Importing the app alone freezes nothing."""
    import subprocess
    import sys

    from tests.processes import REPO, process_env

    code = """
import gc
from controlplane.celery import app
from celery.signals import worker_init
frozen_at_import = gc.get_freeze_count()
app.loader.init_worker()  # what WorkController does before it sends worker_init: the task modules imported
worker_init.send(sender=None)
print(frozen_at_import, gc.get_freeze_count(), len(gc.get_objects()), 'apps.fleets.tasks' in __import__('sys').modules)
"""
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=process_env(), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    frozen_at_import, frozen, tracked, tasks_loaded = done.stdout.split()
    assert frozen_at_import == "0"
    assert tasks_loaded == "True"  # frozen with the task modules (and what they import) in it
    assert int(frozen) > 100_000, done.stdout
    assert int(tracked) < int(frozen) // 20, done.stdout  # what a full collection still walks


class _Big:
    pass


def _freed_in_thread(keep_list_s: float = 0.0) -> str:
    """release_later a list holding an object; the name of the thread the object's last reference died in. The
    caller keeps the list `keep_list_s` longer (the release thread has long run by then)."""
    died = threading.Event()
    names: list[str] = []
    box = [_Big()]
    weakref.finalize(box[0], lambda: (names.append(threading.current_thread().name), died.set()))
    gcpause.release_later(box)
    time.sleep(keep_list_s)
    del box
    assert died.wait(5), "never freed"
    return names[0]


def test_release_later_frees_in_its_thread_even_when_the_caller_drops_its_list_last() -> None:
    # Handing over the object itself freed it in the caller's thread whenever the release thread dropped its
    # reference before the caller had (a full make test saw it once): the release thread empties the list instead.
    assert [_freed_in_thread(keep_list_s=0.05) for _ in range(3)] == ["spillway-release"] * 3


def test_release_later_frees_in_its_thread_in_this_process_and_in_a_forked_child() -> None:
    assert _freed_in_thread() == "spillway-release"  # the parent's thread runs now
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the parent's thread is not here; its own must start
        try:
            os.write(write, _freed_in_thread().encode())
        finally:
            os._exit(0)
    os.close(write)
    try:
        ready, _, _ = select.select([read], [], [], 10.0)
        answer = os.read(read, 100).decode() if ready else "(no answer within 10 s)"
    finally:
        os.close(read)
        if not ready:
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    assert answer == "spillway-release", answer


def test_the_release_thread_outlives_a_caller_that_hands_it_no_list(caplog) -> None:
    # A thread that died would leave every later release queued for good: evicted bundles piling up.
    with caplog.at_level(logging.ERROR, logger="spillway.gc"):
        gcpause.release_later(("not", "a", "list"))  # type: ignore[arg-type]
        assert _freed_in_thread() == "spillway-release"
    assert "not a list" in caplog.text
