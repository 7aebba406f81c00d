"""`make test` fails, not skips, when a dependency is missing (tests/deps.py + the hook in conftest)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.processes import REPO

pytestmark = pytest.mark.process  # runs pytest itself in a child process

PROBE = "tests/probes/missing_dep_probe.py"


@pytest.fixture(scope="module")
def runs() -> dict[str, subprocess.CompletedProcess[str]]:
    """The probe run twice, strict and with the opt-out, side by side (each child pays Django's start-up)."""
    base = {k: v for k, v in os.environ.items() if k != "SPILLWAY_ALLOW_SKIPS"}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", PROBE]
    procs = {name: subprocess.Popen(cmd, cwd=REPO, env=base | env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
             for name, env in (("strict", {}), ("allowed", {"SPILLWAY_ALLOW_SKIPS": "1"}))}
    out = {}
    for name, proc in procs.items():
        stdout, _ = proc.communicate(timeout=120)
        out[name] = subprocess.CompletedProcess(cmd, proc.returncode, stdout)
    return out


def test_a_missing_dependency_fails_the_run_and_says_how_to_install_it(runs) -> None:
    result = runs["strict"]
    assert result.returncode == 1, result.stdout
    assert "1 failed, 1 passed" in result.stdout
    assert "apt-get install frobnicator" in result.stdout


def test_the_opt_out_lets_it_skip_but_says_so_loudly(runs) -> None:
    result = runs["allowed"]
    assert result.returncode == 0, result.stdout
    assert "1 passed, 1 skipped" in result.stdout
    assert "SPILLWAY_ALLOW_SKIPS=1: 1 tests did NOT run" in result.stdout
    assert "test_needs_something_absent" in result.stdout
