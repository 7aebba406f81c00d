"""Personas and API clients shared by the whole suite (the healthchecks way).

alice: owner of org `acme`; bob: editor in `acme` (teammate); vera: viewer in `acme`;
charlie: admin of `globex` (outsider, must get 404 for acme's objects);
otto: admin of the operator org `ops` (sees everything).
"""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Organization, Role
from tests import deps, ordering
from tests.factories import OrganizationFactory
from tests.personas import Persona, persona

# Fixtures any test may ask for by name, wherever it lives (a test module imports helpers, never fixtures).
pytest_plugins = ["tests.haproxykit", "tests.worlds", "tests.fleets.drainkit", "tests.quiet"]

@pytest.fixture
def acme(db) -> Organization:
    return OrganizationFactory(slug="acme", kind=Organization.Kind.CUSTOMER)


@pytest.fixture
def globex(db) -> Organization:
    return OrganizationFactory(slug="globex", kind=Organization.Kind.CUSTOMER)


@pytest.fixture
def ops(db) -> Organization:
    return OrganizationFactory(slug="ops", kind=Organization.Kind.OPERATOR)


@pytest.fixture
def alice(acme) -> Persona:
    return persona("alice", acme, Role.OWNER)


@pytest.fixture
def bob(acme) -> Persona:
    return persona("bob", acme, Role.EDITOR)


@pytest.fixture
def vera(acme) -> Persona:
    return persona("vera", acme, Role.VIEWER)


@pytest.fixture
def charlie(globex) -> Persona:
    return persona("charlie", globex, Role.ADMIN)


@pytest.fixture
def otto(ops) -> Persona:
    return persona("otto", ops, Role.ADMIN)


@pytest.fixture
def anon() -> APIClient:
    return APIClient()


# --- real processes -----------------------------------------------------------------

import os  # noqa: E402
import subprocess  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402

from tests.processes import (  # noqa: E402
    CeleryWorker,
    ForkedProcess,
    close_fork_servers,
    process_env,
    reap_leaving,
    start_python,
    stop_celery_workers,
)


@pytest.fixture
def celery_worker_factory(tmp_path) -> Iterator[Callable[..., subprocess.Popen | ForkedProcess]]:
    """Start real Celery workers (`celery -A controlplane worker`) against the test database.

    Needs REDIS_URL (the suite's broker) and a transactional test. Each call starts one
    worker with its own hostname; all are stopped by PID at teardown.
    """
    if not os.environ.get("REDIS_URL"):
        deps.missing("real Celery workers need REDIS_URL (make test sets it)")
    workers: list[CeleryWorker] = []
    # Drop messages left by earlier tests once, before this test enqueues anything. Not per
    # worker (`--purge`): a worker started mid-test would delete messages the test just sent.
    from controlplane.celery import app as celery_app

    reap_leaving()  # an earlier test's workers still exiting: gone before these start
    celery_app.control.purge()

    def start(name: str = "w1", concurrency: int = 1, queues: str | None = None, pool: str = "prefork",
              **env: str) -> subprocess.Popen | ForkedProcess:
        args = ["-A", "controlplane", "worker", "--pool", pool, "--concurrency", str(concurrency),
                "--hostname", f"{name}@%h", "--without-gossip", "--without-mingle", "--loglevel", "INFO"]
        # Default: every queue (the default one, the fleet reconciles', the event deliveries' and ACME's), so
        # one worker does what `make run`'s workers do together.
        from django.conf import settings

        args += ["--queues", queues or ",".join(["celery", *settings.FLEET_QUEUES, "events", "acme"])]
        log = tmp_path / f"celery-{name}.log"
        proc = start_python(["-m", "celery", *args], process_env(**env), log)
        workers.append(CeleryWorker(proc, log, pool, concurrency))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if b"ready." in log.read_bytes():
                return proc
            if proc.poll() is not None:
                raise RuntimeError(log.read_text())
            time.sleep(0.05)
        raise RuntimeError(f"celery worker {name} did not become ready in 30 s")

    def stop(*procs: subprocess.Popen | ForkedProcess, timeout_s: float = 10.0) -> None:
        """Stop these workers now, as the teardown would (before what their tasks talk to goes away)."""
        stop_celery_workers([w for w in workers if w.proc in procs], timeout_s)

    start.stop = stop  # type: ignore[attr-defined]
    yield start
    stop_celery_workers(workers)


@pytest.fixture(scope="session", autouse=True)
def _reap_celery_workers_still_exiting() -> Iterator[None]:
    """Workers a test's teardown left exiting (tests/processes.stop_celery_workers) are waited for by the end, then
    the fork servers end."""
    yield
    reap_leaving()
    close_fork_servers()


# Fixtures that start real processes or servers: a test using one is marked `process`, so `make test-fast` (the
# inner loop) can leave it out without anyone remembering to mark it.
# cdktf_worker: jsii runs the providers' code in a node process (13-15 s to load both, per test worker).
PROCESS_FIXTURES = frozenset({"celery_worker_factory", "live_server", "page", "browser", "cap_workers",
                              "tiny_backend", "haproxy_bin", "sshd", "demo_fleet_addresses", "cdktf_worker"})


# `make test-durations`: each file's wall time and CPU go to tests/file_durations.json, which orders the next runs.
RECORDING = os.environ.get(ordering.RECORD_ENV) == "1"
_CPU_AT_START = pytest.StashKey[float]()


def pytest_collection_modifyitems(config, items):
    for item in items:
        if PROCESS_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.process)
    times = ordering.recorded()
    if times:
        files = list(dict.fromkeys(item.location[0] for item in items))
        rank = {name: index for index, name in enumerate(ordering.file_order(files, times))}
        position = {item: index for index, item in enumerate(items)}
        items.sort(key=lambda item: (rank[item.location[0]], position[item]))


# Files that load cdktf (its node process: 9-10 s per xdist worker to start) go to one worker together, so the
# suite pays that start once.
ONE_WORKER_GROUPS = {"tests/cloud/": "tests/cloud/ (cdktf)"}


def pytest_xdist_make_scheduler(config, log):
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class GroupedFiles(LoadFileScheduling):
        """--dist loadfile, with each of ONE_WORKER_GROUPS' directories as one file."""

        def _split_scope(self, nodeid: str) -> str:
            scope = super()._split_scope(nodeid)
            return next((group for prefix, group in ONE_WORKER_GROUPS.items() if scope.startswith(prefix)), scope)

    return GroupedFiles(config, log)


def pytest_collection_finish(session):
    """Every test module, Django and the libraries are imported by now and live until the worker ends: frozen, they
    are no longer walked by each full garbage collection (~0.35 s each, ~20 per worker in `make test-fast`: a tenth of
    its time)."""
    from apps.core import gcpause

    gcpause.freeze_startup_heap()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    if RECORDING:
        item.stash[_CPU_AT_START] = ordering.cpu_now()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip for a missing dependency (tests.deps.missing) is a failure unless SPILLWAY_ALLOW_SKIPS=1."""
    report = yield
    if deps.is_missing_dependency(report) and not deps.allowed():
        report.outcome = "failed"
        report.longrepr = (f"{report.longrepr[2]}\n(make test installs it: scripts/setup-system; "
                           f"{deps.ALLOW_ENV}=1 allows a partial run)")
    if RECORDING and call.when == "teardown" and _CPU_AT_START in item.stash:
        # A new list: the report's is the item's own (junit and other reports read it).
        report.user_properties = [*report.user_properties,
                                  (ordering.CPU_PROPERTY, ordering.cpu_now() - item.stash[_CPU_AT_START])]
    return report


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if RECORDING and not hasattr(config, "workerinput"):
        totals: dict[str, tuple[float, float]] = {}
        for reports in terminalreporter.stats.values():
            for report in reports:
                if isinstance(report, pytest.TestReport):
                    wall, cpu = totals.get(report.location[0], (0.0, 0.0))
                    cpu += sum(value for key, value in report.user_properties if key == ordering.CPU_PROPERTY)
                    totals[report.location[0]] = (wall + report.duration, cpu)
        if totals:  # a run that ran nothing (a collection error, `-k` matching nothing) keeps the record
            ordering.write(totals)
            wall, cpu = sum(w for w, _ in totals.values()), sum(c for _, c in totals.values())
            terminalreporter.write_line(f"wrote {ordering.FILE_DURATIONS} ({len(totals)} files, {wall:.0f} s, "
                                        f"CPU {cpu:.0f} s)")
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        from tests.dbsetup import drop_template

        drop_template(config)
    # From the reports (not the workers' state): under xdist the controller prints the summary.
    missing = [f"{r.nodeid}: {r.longrepr[2]}" for r in terminalreporter.stats.get("skipped", [])
               if deps.is_missing_dependency(r)]
    if missing and deps.allowed():
        terminalreporter.write_sep("!", f"{deps.ALLOW_ENV}=1: {len(missing)} tests did NOT run (missing dependencies)",
                                   red=True, bold=True)
        for line in dict.fromkeys(missing):
            terminalreporter.write_line(line, red=True)


from tests.browser import browser, page  # noqa: E402, F401  (one shared Playwright session)
from tests.dbsetup import django_db_setup, fast_flush  # noqa: E402, F401  (one migrated template, copied per worker)

fast_flush()  # transactional tests' teardown: DELETE, not TRUNCATE (tests/dbsetup.py)
