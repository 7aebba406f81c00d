"""Run `terraform`/`tofu` in a per-target working directory, with credentials passed by reference only.

A cloud target stores a credentials *reference*: the name of an environment variable of the worker, or the
path of a credentials file on the worker. The reference is resolved only into the environment of the child
process, and both the reference and what it resolves to are scrubbed from everything captured, because
provider error messages like to quote the file they could not read.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from django.conf import settings

ENV_REF_RE = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
SCRUBBED = "[credentials]"
OUTPUT_LIMIT_CHARS = 200_000
INIT_TIMEOUT_S = 300
PLAN_TIMEOUT_S = 900
APPLY_TIMEOUT_S = 3600


def terraform_bin() -> str | None:
    """TERRAFORM_BIN when set, else `terraform` or `tofu` from PATH; None when there is none."""
    configured = getattr(settings, "TERRAFORM_BIN", "") or ""
    if configured:
        return configured if Path(configured).is_file() and os.access(configured, os.X_OK) else None
    return shutil.which("terraform") or shutil.which("tofu")


def credentials_problem(ref: str) -> str | None:
    """Why the reference cannot be used, without ever naming it; None when it resolves."""
    if not ref:
        return "the cloud target has no credentials reference"
    if ENV_REF_RE.fullmatch(ref):
        if not os.environ.get(ref):
            return "the environment variable named by the target's credentials reference is not set on the worker"
        return None
    if ref.startswith("/"):
        if not Path(ref).is_file():
            return "the credentials file named by the target's credentials reference does not exist on the worker"
        return None
    return "the credentials reference is neither an environment variable name nor an absolute file path"


def apply_unavailable_reason(ref: str) -> str | None:
    """The exact reason the plan/apply runner cannot run here, or None."""
    configured = getattr(settings, "TERRAFORM_BIN", "") or ""
    if terraform_bin() is None:
        if configured:
            return "TERRAFORM_BIN is set but does not point to an executable file on the worker."
        return "No terraform binary: TERRAFORM_BIN is empty and neither terraform nor tofu is on PATH."
    problem = credentials_problem(ref)
    if problem:
        return f"No credentials: {problem}."
    return None


def credentials_env(provider: str, ref: str) -> dict[str, str]:
    """Environment for the child: the provider's standard variable, filled from the reference."""
    if ENV_REF_RE.fullmatch(ref):
        value = os.environ.get(ref, "")
        # GCP: the variable holds the service-account JSON (or its path); AWS: the variable names a profile.
        return {"GOOGLE_CREDENTIALS": value} if provider == "gcp" else {"AWS_PROFILE": value}
    if provider == "gcp":
        return {"GOOGLE_APPLICATION_CREDENTIALS": ref}
    return {"AWS_SHARED_CREDENTIALS_FILE": ref}


def secrets_of(ref: str) -> list[str]:
    """Every string that must not survive into stored output: the reference and what it resolves to."""
    found = [ref] if ref else []
    if ref and ENV_REF_RE.fullmatch(ref):
        value = os.environ.get(ref, "")
        found += [value] if len(value) >= 4 else []
    return sorted(set(found), key=len, reverse=True)  # longest first: a value may contain the name


def scrub(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, SCRUBBED)
    return text


@dataclass(frozen=True)
class RunResult:
    argv: list[str]
    returncode: int
    output: str  # stdout and stderr interleaved, scrubbed

    @property
    def timed_out(self) -> bool:
        return self.returncode == -9


def run(binary: str, args: list[str], *, cwd: Path, provider: str, ref: str, timeout_s: int) -> RunResult:
    """Run one terraform command; never raises for a failing command, only returns its code and output."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(cwd),
        "TF_IN_AUTOMATION": "1",
        "TF_INPUT": "0",
        "CHECKPOINT_DISABLE": "1",
        "TF_PLUGIN_CACHE_DIR": str(_plugin_cache()),
        **credentials_env(provider, ref),
    }
    argv = [binary, *args]
    try:
        proc = subprocess.run(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=timeout_s, check=False)
        code, raw = proc.returncode, proc.stdout
    except subprocess.TimeoutExpired as exc:  # subprocess.run kills the child before raising
        code, raw = -9, (exc.stdout or b"") + f"\n[timed out after {timeout_s} s]\n".encode()
    except OSError as exc:
        code, raw = 127, f"cannot start {binary}: {exc.strerror}\n".encode()
    text = scrub(raw.decode("utf-8", "replace"), secrets_of(ref))
    return RunResult(argv=[Path(binary).name, *args], returncode=code, output=text[-OUTPUT_LIMIT_CHARS:])


def workdir(target_name: str, lb_name: str) -> Path:
    path = Path(settings.VAR_DIR) / "cloud" / target_name / lb_name
    path.mkdir(parents=True, exist_ok=True)
    return path


def _plugin_cache() -> Path:
    path = Path(settings.VAR_DIR) / "cloud" / ".plugin-cache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def plan_diff(plan_text: str) -> str:
    """The resource lines of a plan: what a reviewer reads before approving."""
    keep = []
    for line in plan_text.splitlines():
        stripped = line.lstrip()
        if stripped.startswith(("+ ", "- ", "~ ", "-/+ ", "+/- ", "# ", "Plan:", "No changes.")):
            keep.append(line)
    return "\n".join(keep)
