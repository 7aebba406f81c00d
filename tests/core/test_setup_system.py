"""scripts/setup-system (what `make test`, `make run` and .ci/run run first)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest

from tests.processes import REPO

SCRIPT = str(REPO / "scripts" / "setup-system")


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root to run as nobody")
def test_without_root_a_missing_package_stops_at_once_with_the_exact_command() -> None:
    # In /tmp itself: pytest's tmp_path sits under a 0700 directory nobody cannot read.
    with tempfile.NamedTemporaryFile("w", prefix="s16-apt-", dir="/tmp") as fh:
        fh.write("# comment\nsh dash\nfrobnicator frobnicator-pkg\n")
        fh.flush()
        os.chmod(fh.name, 0o644)
        result = _as_nobody(fh.name)
    assert result.returncode == 1
    assert result.stderr.strip() == "setup: missing system packages; run: sudo apt-get install -y frobnicator-pkg"


def _as_nobody(packages: str) -> subprocess.CompletedProcess[str]:
    """The script run as nobody from a copy in /tmp: the checkout itself may sit under a directory nobody
    cannot enter (a clone in a 0700 home), which says nothing about the script."""
    with tempfile.TemporaryDirectory(prefix="s16-setup-", dir="/tmp") as root:
        os.chmod(root, 0o755)  # noqa: S103 - nobody must enter it, like a checkout
        os.makedirs(f"{root}/scripts")
        copy = shutil.copy(SCRIPT, f"{root}/scripts/setup-system")
        os.chmod(copy, 0o755)  # noqa: S103 - nobody must run it
        cmd = ["runuser", "-u", "nobody", "--", "env", f"APT_PACKAGES_FILE={packages}", copy, "run"]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60)


def test_on_a_set_up_machine_it_is_quick_and_quiet() -> None:
    db = os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/spillway")
    result = subprocess.run([SCRIPT, "test", db], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == ""
