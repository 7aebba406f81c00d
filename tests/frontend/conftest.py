# The browser fixtures live in tests/browser.py and are registered once, in tests/conftest.py,
# so every suite shares one Playwright session (two sessions in one thread break each other).
from __future__ import annotations

import fcntl
import shutil
from collections.abc import Iterator

import pytest

from apps.balancers import demo as balancers_demo
from apps.balancers.models import LoadBalancer
from apps.core import ports
from apps.fleets import demo as fleets_demo
from apps.fleets.models import Rollout
from tests import deps
from tests.browser import login, shot  # noqa: F401
from tests.frontend.demokit import BACKENDS, NODES

# Two test files start this fleet on the same addresses: on two xdist workers a port check alone let both start
# (the second one's roll-out failed); with the lock the second waits for the first to stop its fleet.
DEMO_FLEET_LOCK = "/tmp/spillway-browser-demo-fleet.lock"


@pytest.fixture
def demo_fleet(transactional_db, settings, tmp_path, monkeypatch, celery_worker_factory) -> Iterator[LoadBalancer]:
    if shutil.which(settings.HAPROXY_BIN) is None:
        deps.missing("haproxy is not installed (apt-get install haproxy)")
    with open(DEMO_FLEET_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        busy = [a for addrs in NODES.values() for a in addrs if not ports.is_free(a, 8080)]
        if busy:
            pytest.skip(f"another run of this test holds {busy}")
        monkeypatch.setattr(fleets_demo, "DEMO_NODES", NODES)
        monkeypatch.setattr(fleets_demo, "DEMO_BACKENDS", BACKENDS)
        monkeypatch.setattr(balancers_demo, "DEMO_BACKENDS", BACKENDS)
        settings.VAR_DIR = tmp_path / "var"
        balancers_demo.load_demo()
        fleets_demo.load_demo()
        worker = None
        try:
            message = fleets_demo.start_demo_processes()
            assert "4 HAProxy nodes" in message, message
            assert set(Rollout.objects.values_list("status", flat=True)) == {"succeeded"}
            worker = celery_worker_factory(name="ws-w1", concurrency=1)  # later changes roll out through it
            yield LoadBalancer.objects.get(name="edge")
        finally:
            if worker is not None:  # before the nodes: its warm shutdown waits for a task talking to a stopped node
                celery_worker_factory.stop(worker)
            fleets_demo.stop_demo_processes()
