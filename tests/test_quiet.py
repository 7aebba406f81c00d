"""A `quiet` test (tests/quiet.py) runs while no other test does, and the rest still run side by side: a real
pytest-xdist run of three workers over files that write down when each test ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

RECORDER = '''
import json, os, time

import pytest


def ran(name, seconds):
    started = time.monotonic()
    time.sleep(seconds)
    with open(os.environ["QUIET_LOG"], "a") as log:
        log.write(json.dumps([name, started, time.monotonic()]) + "\\n")
'''


def _write_suite(root: Path) -> None:
    (root / "pytest.ini").write_text("[pytest]\naddopts = --strict-markers\n")
    (root / "conftest.py").write_text('pytest_plugins = ["tests.quiet"]\n')
    (root / "recorder.py").write_text(RECORDER)
    for quiet in ("q1", "q2"):
        (root / f"test_{quiet}.py").write_text(
            "import pytest\nfrom recorder import ran\n\n"
            f"@pytest.mark.quiet\ndef test_{quiet}():\n    ran('{quiet}', 0.5)\n\n"
            f"def test_{quiet}_neighbour():\n    ran('{quiet}-neighbour', 0.2)\n")
    for plain in range(4):
        (root / f"test_plain{plain}.py").write_text(
            "from recorder import ran\n\n"
            + "".join(f"def test_{n}():\n    ran('p{plain}-{n}', 0.2)\n\n" for n in range(3)))


def _overlap(a: list, b: list) -> bool:
    return a[1] < b[2] and b[1] < a[2]


def test_a_quiet_test_runs_alone_and_the_others_run_side_by_side(tmp_path) -> None:
    suite = tmp_path / "suite"
    suite.mkdir()
    _write_suite(suite)
    log = tmp_path / "ran.jsonl"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{suite}", "QUIET_LOG": str(log)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "3", "--dist", "loadfile",
         "--basetemp", str(tmp_path / "basetemp"), "-c", str(suite / "pytest.ini"), str(suite)],
        cwd=suite, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "16 passed" in done.stdout

    runs = [json.loads(line) for line in log.read_text().splitlines()]
    quiet = [r for r in runs if r[0] in ("q1", "q2")]
    others = [r for r in runs if r not in quiet]
    assert len(quiet) == 2 and len(others) == 14
    for q in quiet:
        assert not [o[0] for o in others if _overlap(q, o)], f"{q[0]} shared the machine"
    assert not _overlap(*quiet)
    # The lock did not put everything in a line: the plain tests still ran in parallel.
    assert any(_overlap(a, b) for i, a in enumerate(others) for b in others[i + 1:])
