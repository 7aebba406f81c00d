"""A `quiet` test (tests/quiet.py) runs ahead of the other tests, or with at most one other test beside it, and the
rest still run side by side: a real pytest-xdist run of four workers over files that write down when each test ran,
and at what nice the kernel ran its session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import quiet
from tests.processes import REPO
from tests.waiting import wait_for

PLAIN_TESTS = 5  # in each of 4 files

RECORDER = '''
import json, os, time

import pytest


def ran(name, seconds):
    started = time.monotonic()
    time.sleep(seconds)
    with open("/proc/self/autogroup") as group:
        nice = int(group.read().split()[-1])
    with open(os.environ["QUIET_LOG"], "a") as log:
        log.write(json.dumps([name, started, time.monotonic(), nice]) + "\\n")
'''


def _write_suite(root: Path, quiet_files: tuple[str, ...]) -> None:
    (root / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    (root / "conftest.py").write_text('pytest_plugins = ["tests.quiet"]\n')
    (root / "recorder.py").write_text(RECORDER)
    for name in quiet_files:
        (root / f"test_0_{name}.py").write_text(  # handed out first: plain tests are left to run beside it
            "import pytest\nfrom recorder import ran\n\n"
            f"@pytest.mark.quiet\ndef test_{name}():\n    ran('{name}', 0.5)\n\n"
            f"def test_{name}_neighbour():\n    ran('{name}-neighbour', 0.2)\n")
    for plain in range(4):
        (root / f"test_plain{plain}.py").write_text(
            "from recorder import ran\n\n"
            + "".join(f"def test_{n}():\n    ran('p{plain}-{n}', 0.2)\n\n" for n in range(PLAIN_TESTS)))


def _overlap(a: list, b: list) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def _most_at_once(window: list, runs: list[list]) -> int:
    """The most of `runs` running at one moment inside `window`."""
    inside = [r for r in runs if _overlap(window, r)]
    # An end sorts before a start at the same moment: (t, -1) < (t, 1).
    edges = sorted([(max(r[1], window[1]), 1) for r in inside] + [(min(r[2], window[2]), -1) for r in inside])
    most = running = 0
    for _, step in edges:
        running += step
        most = max(most, running)
    return most


def _run_suite(tmp_path: Path, quiet_files: tuple[str, ...], *options: str) -> tuple[str, list[list]]:
    suite = tmp_path / "suite"
    suite.mkdir()
    _write_suite(suite, quiet_files)
    log = tmp_path / "ran.jsonl"
    # Only xdist and the plugin: the project's other pytest plugins cost each of the five processes ~1 s of CPU.
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{suite}", "QUIET_LOG": str(log),
           "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "xdist.plugin", "-p", "no:cacheprovider", "-n", "4",
         "--dist", "loadfile", "--no-loadscope-reorder",
         "--basetemp", str(tmp_path / "basetemp"), "-c", str(suite / "pytest.ini"), str(suite), *options],
        cwd=suite, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{4 * PLAIN_TESTS + 2 * len(quiet_files)} passed" in done.stdout
    return done.stdout, [json.loads(line) for line in log.read_text().splitlines()]


@pytest.mark.slow  # five pytest processes: not for `make test-fast`
@pytest.mark.parametrize(("beside", "quiet_files"), [(None, ("q1", "q2")), (2, ("q1",))], ids=["seats-rule", "option"])
def test_a_quiet_test_runs_with_few_others_and_the_others_run_side_by_side(tmp_path, beside, quiet_files) -> None:
    """Where quiet tests cannot be set ahead (--quiet-boost off stands for a machine without CAP_SYS_NICE or
    autogroups): the seats' rule (one beside; two quiet tests, which never overlap), and --quiet-beside (one quiet
    test, so the three other workers all run plain tests and one too many beside would show)."""
    allowed = quiet.BESIDE if beside is None else beside
    stdout, runs = _run_suite(tmp_path, quiet_files, "--quiet-boost", "off",
                              *([] if beside is None else ["--quiet-beside", str(beside)]))
    quiets = [r for r in runs if r[0] in quiet_files]
    others = [r for r in runs if r not in quiets]
    assert len(quiets) == len(quiet_files) and len(others) == 4 * PLAIN_TESTS + len(quiet_files)
    for q in quiets:
        assert _most_at_once(q, others) <= allowed, f"{q[0]} shared the machine with more"
    assert not any(_overlap(a, b) for i, a in enumerate(quiets) for b in quiets[i + 1:])
    # Not everything in a line: tests ran beside the quiet ones, and the plain ones side by side.
    assert any(_overlap(q, o) for q in quiets for o in others)
    assert _most_at_once([None, min(r[1] for r in runs), max(r[2] for r in runs)], others) >= 2
    assert {r[3] for r in runs} == {0}  # nobody set ahead
    # The summary says what they cost.
    room = f"room for at most {allowed} other{'s' * (allowed != 1)} beside"
    assert f"quiet tests: {len(quiet_files)} ran with {room}" in stdout


@pytest.mark.slow
@pytest.mark.skipif(not quiet.can_boost(), reason="needs CAP_SYS_NICE and the kernel's autogroups (root in CI)")
def test_a_boosted_quiet_test_runs_ahead_while_the_others_go_on_and_its_worker_comes_back_after(tmp_path) -> None:
    """Where the machine allows it (the suite's default), a quiet test's session runs at nice -10 for its call, the
    other workers' tests go on beside it at 0, two quiet tests still never overlap, and the test after a quiet one
    in the same worker runs at 0 again."""
    stdout, runs = _run_suite(tmp_path, ("q1", "q2"))
    quiets = [r for r in runs if r[0] in ("q1", "q2")]
    others = [r for r in runs if r not in quiets]
    assert [r[3] for r in quiets] == [quiet.BOOST_NICE] * 2
    assert {r[3] for r in others} == {0}, "only the quiet test's own session runs ahead"
    assert not _overlap(*quiets)
    assert max(_most_at_once(q, others) for q in quiets) >= 2, "the other workers waited for the quiet tests"
    assert ("quiet tests: 2 ran ahead of the others (their sessions at nice -10) with room for at most 3 others"
            in stdout)


@pytest.mark.skipif(not quiet.can_boost(), reason="needs CAP_SYS_NICE and the kernel's autogroups (root in CI)")
def test_boosting_follows_sessions_started_meanwhile_and_puts_each_back(tmp_path) -> None:
    """A node's HAProxy or a load generator's server runs in a session of its own: the ones there before the call
    and the ones started during it run at nice -10 until the call ends, and every session is back at its own nice
    after (this process's too)."""
    def child() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)

    mine = quiet.autogroup(os.getpid())
    before, meanwhile = child(), None
    try:
        with quiet.boosted(follow_s=0.05):
            assert quiet.autogroup(os.getpid())[1] == quiet.BOOST_NICE
            assert quiet.autogroup(before.pid)[1] == quiet.BOOST_NICE
            meanwhile = child()
            assert wait_for(lambda: quiet.autogroup(meanwhile.pid)[1] == quiet.BOOST_NICE, 5, 0.02)
        assert quiet.autogroup(os.getpid()) == mine
        assert quiet.autogroup(before.pid)[1] == 0 and quiet.autogroup(meanwhile.pid)[1] == 0
    finally:
        for proc in (before, meanwhile):
            if proc is not None:
                proc.kill()
                proc.wait()
