"""scripts/test-workers: how many xdist workers `make test` runs (see the script for why)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
from importlib.machinery import SourceFileLoader

from tests.processes import REPO

SCRIPT = REPO / "scripts" / "test-workers"
_spec = importlib.util.spec_from_loader("test_workers_script", SourceFileLoader("test_workers_script", str(SCRIPT)))
workers = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(workers)


def test_two_workers_per_core_only_on_a_fast_idle_machine() -> None:
    reference = workers.REFERENCE_S
    assert workers.choose(2, reference, 0.0) == 4
    assert workers.choose(2, reference * 2, 0.0) == 4  # quiet tests run ahead, or beside one (tests/quiet.py)
    assert workers.choose(2, reference * 2.5, 0.0) == 2  # slower still: one per core
    assert workers.choose(2, reference, 0.9) == 2  # something else keeps the cores busy
    assert workers.choose(64, reference, 0.0) == workers.MAX_WORKERS  # Redis has 16 databases


def test_three_workers_per_core_only_where_quiet_tests_run_ahead_on_a_fast_idle_machine() -> None:
    reference = workers.REFERENCE_S
    assert workers.choose(2, reference, 0.0, boost=True) == 6
    assert workers.choose(2, reference * 1.25, 0.0, boost=True) == 6
    assert workers.choose(2, reference, 0.0, boost=False) == 4  # quiet tests would wait for five seats to empty
    assert workers.choose(2, reference * 1.5, 0.0, boost=True) == 4
    assert workers.choose(2, reference * 2.5, 0.0, boost=True) == 2
    assert workers.choose(2, reference, 0.9, boost=True) == 2


def test_the_same_rule_for_quiet_tests_on_every_machine() -> None:
    # A fast machine once let quiet tests run beside all the others at equal priority; three of seven such runs failed
    # one. tests/quiet.py alone decides how they run (ahead of the others, or with one beside), whatever the count.
    env = {k: v for k, v in os.environ.items() if k != "SPILLWAY_TEST_WORKERS"}
    chosen = subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, check=True).stdout
    assert "--dist loadfile" in chosen or chosen.strip() == ""
    assert "--quiet-beside" not in chosen
    assert workers.xdist_args(4) == "-n 4 --dist loadfile --no-loadscope-reorder"


def test_the_count_can_be_set_and_one_worker_runs_without_xdist() -> None:
    def run(count: str) -> str:
        env = {**os.environ, "SPILLWAY_TEST_WORKERS": count}
        return subprocess.run([str(SCRIPT)], env=env, capture_output=True, text=True, check=True).stdout.strip()

    assert run("3") == "-n 3 --dist loadfile --no-loadscope-reorder"
    assert run("1") == ""
