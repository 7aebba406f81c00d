"""Schemathesis against a live Spillway: every operation of /api/v1/schema/, all checks.

Shared by the suite's bounded run (tests/core/test_schemathesis.py, live_server) and the bigger
`make bench-fuzz` (tests/bench/bench_fuzz.py, a gunicorn child on its own database). Counts come
from schemathesis' JUnit report: a testcase per operation, each failure names its check.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class FuzzResult:
    cases: int = 0
    operations: int = 0
    server_errors: int = 0
    conformance_failures: int = 0
    other_failures: int = 0
    failures: list[str] = field(default_factory=list)
    blocking: list[str] = field(default_factory=list)  # the failures with a 5xx or a conformance check among them
    output: str = ""

    def line(self) -> str:
        return (f"RESULT cases={self.cases} operations={self.operations} server_errors={self.server_errors} "
                f"conformance_failures={self.conformance_failures} other_failures={self.other_failures}")


# Operations that can take the fuzzing principal's own authority away: revoke or delete its token, demote or
# remove its membership, delete or re-kind its org. They are fuzzed too, but in a pass of their own after all
# the others, so a lucky id cannot turn the rest of the run into 401s.
LOCKOUT_OPERATIONS = ("tokens_destroy", "tokens_revoke_create", "memberships_update", "memberships_partial_update",
                      "memberships_destroy", "organizations_update", "organizations_partial_update",
                      "organizations_destroy")


def run_schemathesis(base_url: str, token: str, *, max_examples: int, workers: int = 2, max_time_s: int = 0,
                     seed: int = 1, phases: str = "examples,coverage,fuzzing") -> FuzzResult:
    """Everything but LOCKOUT_OPERATIONS, then those (a fifth of `max_time_s` for them); counts summed."""
    rest = [arg for op in LOCKOUT_OPERATIONS for arg in ("--exclude-operation-id", op)]
    lockout = [arg for op in LOCKOUT_OPERATIONS for arg in ("--include-operation-id", op)]
    first_time, last_time = (max_time_s - max_time_s // 5, max(1, max_time_s // 5)) if max_time_s else (0, 0)
    result = _run(base_url, token, rest, max_examples=max_examples, workers=workers, max_time_s=first_time,
                  seed=seed, phases=phases)
    last = _run(base_url, token, lockout, max_examples=max_examples, workers=workers, max_time_s=last_time,
                seed=seed, phases=phases)
    for name in ("cases", "operations", "server_errors", "conformance_failures", "other_failures"):
        setattr(result, name, getattr(result, name) + getattr(last, name))
    result.failures += last.failures
    result.blocking += last.blocking
    result.output += "\n--- lockout operations, fuzzed last ---\n" + last.output
    return result


def _run(base_url: str, token: str, select: list[str], *, max_examples: int, workers: int, max_time_s: int,
         seed: int, phases: str) -> FuzzResult:
    with tempfile.TemporaryDirectory(prefix="spw-fuzz-") as tmp:
        cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{base_url}/api/v1/schema/?format=json",
               "--url", base_url, "--checks", "all", "--max-examples", str(max_examples), "--seed", str(seed),
               "--workers", str(workers), "--phases", phases, "--generation-database", "none",
               "-H", f"Authorization: Bearer {token}", "--report", "junit", "--report-dir", tmp,
               "--request-timeout", "30", "--no-color", "--continue-on-failure", *select]
        if max_time_s:
            cmd += ["--max-time", str(max_time_s)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        result = _parse(Path(tmp))
        result.output = proc.stdout[-20000:] + proc.stderr[-5000:]
        result.cases = cases_generated(proc.stdout)
        return result


def cases_generated(summary: str) -> int:
    """Schemathesis' own count from its summary ("Test cases:\n  28 generated, 2 found ..."); 0 if absent."""
    m = re.search(r"^\s*(\d+) generated\b", summary, flags=re.M)
    return int(m.group(1)) if m else 0


def _parse(report_dir: Path) -> FuzzResult:
    result = FuzzResult()
    for xml in report_dir.glob("*.xml"):
        for case in ET.parse(xml).getroot().iter("testcase"):  # noqa: S314  (our own report file)
            result.operations += 1
            for failure in [*case.iter("failure"), *case.iter("error")]:
                text = (failure.get("message") or "") + "\n" + (failure.text or "")
                blocking = False
                # Each distinct check that failed: "- ST103 Undocumented status code" (ST1xx: the response
                # does not match the schema; ST0xx / "Server error": a 5xx; others: request-side checks).
                for code, title in set(re.findall(r"^- (ST\d+) (.+)$", text, flags=re.M)):
                    if "Server error" in title or code.startswith("ST0"):
                        result.server_errors += 1
                        blocking = True
                    elif code.startswith("ST1"):
                        result.conformance_failures += 1
                        blocking = True
                    else:
                        result.other_failures += 1
                entry = f"{case.get('name', '?')}: {text.strip()[:1500]}"
                result.failures.append(entry)
                if blocking:  # whole, so the check that counts is not cut off behind a request-side one
                    result.blocking.append(f"{case.get('name', '?')}: {text.strip()[:6000]}")
    return result
