"""Missing dependencies fail `make test` instead of skipping quietly.

A test that cannot run because something is not installed calls `missing(...)`: the skip it raises
carries PREFIX, and the hook in tests/conftest.py reports it as a failure, unless SPILLWAY_ALLOW_SKIPS=1
is set for a deliberately partial run (then the run ends with a loud warning listing them).
`make test` installs everything first (scripts/setup-system), so on a set-up machine none fire.
"""

from __future__ import annotations

import os
from typing import NoReturn

import pytest

PREFIX = "missing dependency:"
ALLOW_ENV = "SPILLWAY_ALLOW_SKIPS"


def allowed() -> bool:
    return os.environ.get(ALLOW_ENV, "") not in ("", "0")


def missing(what: str) -> NoReturn:
    pytest.skip(f"{PREFIX} {what}")


def is_missing_dependency(report: pytest.TestReport) -> bool:
    if not report.skipped:
        return False
    longrepr = report.longrepr
    reason = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return PREFIX in reason
