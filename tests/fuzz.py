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
    output: str = ""

    def line(self) -> str:
        return (f"RESULT cases={self.cases} operations={self.operations} server_errors={self.server_errors} "
                f"conformance_failures={self.conformance_failures} other_failures={self.other_failures}")


def run_schemathesis(base_url: str, token: str, *, max_examples: int, workers: int = 2, max_time_s: int = 0,
                     seed: int = 1, phases: str = "examples,coverage,fuzzing") -> FuzzResult:
    with tempfile.TemporaryDirectory(prefix="spw-fuzz-") as tmp:
        cmd = [sys.executable, "-m", "schemathesis.cli", "run", f"{base_url}/api/v1/schema/?format=json",
               "--url", base_url, "--checks", "all", "--max-examples", str(max_examples), "--seed", str(seed),
               "--workers", str(workers), "--phases", phases, "--generation-database", "none",
               "-H", f"Authorization: Bearer {token}", "--report", "junit", "--report-dir", tmp,
               "--request-timeout", "30", "--no-color", "--continue-on-failure"]
        if max_time_s:
            cmd += ["--max-time", str(max_time_s)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
        result = _parse(Path(tmp))
        result.output = proc.stdout[-20000:] + proc.stderr[-5000:]
        cases = [ln for ln in proc.stdout.splitlines() if "test cases" in ln.lower()]
        result.cases = _cases(cases)
        return result


def _cases(lines: list[str]) -> int:
    for ln in lines:
        m = re.search(r"(\d+)\s+generated", ln) or re.search(r"(\d+)\s+test cases", ln.lower())
        if m:
            return int(m.group(1))
    return 0


def _parse(report_dir: Path) -> FuzzResult:
    result = FuzzResult()
    for xml in report_dir.glob("*.xml"):
        for case in ET.parse(xml).getroot().iter("testcase"):  # noqa: S314  (our own report file)
            result.operations += 1
            for failure in [*case.iter("failure"), *case.iter("error")]:
                text = (failure.get("message") or "") + "\n" + (failure.text or "")
                # Each distinct check that failed: "- ST103 Undocumented status code" (ST1xx: the response
                # does not match the schema; ST0xx / "Server error": a 5xx; others: request-side checks).
                for code, title in set(re.findall(r"^- (ST\d+) (.+)$", text, flags=re.M)):
                    if "Server error" in title or code.startswith("ST0"):
                        result.server_errors += 1
                    elif code.startswith("ST1"):
                        result.conformance_failures += 1
                    else:
                        result.other_failures += 1
                result.failures.append(f"{case.get('name', '?')}: {text.strip()[:1500]}")
    return result
