"""Which binary the plan/apply runner uses: TERRAFORM_BIN when set (terraform or OpenTofu's `tofu`), else
`terraform`, else `tofu` from PATH.

OpenTofu is not packaged for Debian and this machine has only HashiCorp's `terraform`, so the `tofu` and
`terraform` here are stand-in executables on a PATH of our own, printing what `version` prints: the
selection, the exec and the name shown to the user are real, only the binary behind the name is not.
The last test runs the machine's real terraform through TERRAFORM_BIN when there is one.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from apps.cloud import terraform_cli


def _fake(directory: Path, name: str, banner: str) -> str:
    path = directory / name
    path.write_text(f'#!/bin/sh\nif [ "$1" = version ]; then echo "{banner}"; exit 0; fi\nexit 3\n')
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def bindir(tmp_path, monkeypatch, settings) -> Path:
    directory = tmp_path / "bin"
    directory.mkdir()
    monkeypatch.setenv("PATH", str(directory))  # nothing else: the machine's own terraform is out of reach
    settings.TERRAFORM_BIN = ""
    return directory


def _version(binary: str, cwd: Path) -> terraform_cli.RunResult:
    return terraform_cli.run(binary, ["version"], cwd=cwd, provider="gcp", ref="", timeout_s=30)


def test_tofu_alone_on_path_is_used_and_named_as_tofu(bindir, tmp_path) -> None:
    tofu = _fake(bindir, "tofu", "OpenTofu v1.10.6")
    assert terraform_cli.terraform_bin() == tofu
    assert terraform_cli.apply_unavailable_reason("").startswith("No credentials:")  # the binary is not the problem
    result = _version(tofu, tmp_path)
    assert result.returncode == 0 and "OpenTofu v1.10.6" in result.output
    assert result.argv == ["tofu", "version"]  # what the plan output shows as "$ tofu ..."


def test_terraform_is_preferred_when_both_are_on_path(bindir) -> None:
    _fake(bindir, "tofu", "OpenTofu v1.10.6")
    terraform = _fake(bindir, "terraform", "Terraform v1.11.4")
    assert terraform_cli.terraform_bin() == terraform


def test_terraform_bin_wins_over_path_either_way(bindir, tmp_path, settings) -> None:
    terraform = _fake(bindir, "terraform", "Terraform v1.11.4")
    elsewhere = tmp_path / "opt"
    elsewhere.mkdir()
    tofu = _fake(elsewhere, "tofu", "OpenTofu v1.10.6")
    settings.TERRAFORM_BIN = tofu
    assert terraform_cli.terraform_bin() == tofu
    assert "OpenTofu" in _version(terraform_cli.terraform_bin() or "", tmp_path).output
    settings.TERRAFORM_BIN = terraform
    assert terraform_cli.terraform_bin() == terraform


def test_a_terraform_bin_that_cannot_run_is_refused_not_replaced(bindir, tmp_path, settings) -> None:
    """Set but wrong (missing, or not executable): no silent fallback to whatever PATH has."""
    _fake(bindir, "terraform", "Terraform v1.11.4")
    not_executable = tmp_path / "tofu"
    not_executable.write_text("#!/bin/sh\n")
    for configured in (str(tmp_path / "missing" / "tofu"), str(not_executable)):
        settings.TERRAFORM_BIN = configured
        assert terraform_cli.terraform_bin() is None
        assert terraform_cli.apply_unavailable_reason("SPW_ANY") == (
            "TERRAFORM_BIN is set but does not point to an executable file on the worker.")


def test_neither_binary_gives_the_reason(bindir) -> None:
    assert terraform_cli.terraform_bin() is None
    assert terraform_cli.apply_unavailable_reason("SPW_ANY") == (
        "No terraform binary: TERRAFORM_BIN is empty and neither terraform nor tofu is on PATH.")


REAL = [shutil.which(name, path=os.defpath + ":/usr/local/bin") for name in ("terraform", "tofu")]


@pytest.mark.parametrize("real", [r for r in REAL if r] or [None])
def test_the_real_binary_of_this_machine_through_terraform_bin(real, bindir, tmp_path, settings) -> None:
    if real is None:
        pytest.skip("neither terraform nor tofu is installed here (the stand-ins above still ran)")
    settings.TERRAFORM_BIN = real
    assert terraform_cli.terraform_bin() == real
    result = _version(real, tmp_path)
    assert result.returncode == 0, result.output
    assert ("Terraform v" if real.endswith("terraform") else "OpenTofu v") in result.output
