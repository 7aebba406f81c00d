"""One cdktf worker per test session.

Importing a prebuilt cdktf provider costs seconds (the jsii node process loads the provider assembly), so
the providers are loaded once per session by `cdktf_worker`, as a long-lived Spillway worker does; the
jsii node child process is ended by jsii's own exit handler when pytest exits. The demo LBs are
tests/cloud/cloudkit.py's.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from typing import Any

import pytest

from tests import deps


@pytest.fixture(scope="session")
def cdktf_worker() -> Callable[..., dict[str, Any]]:
    """`synthesize` with both providers loaded once; skips (with the reason) only where cdktf cannot run."""
    if shutil.which("node") is None:
        deps.missing("cdktf needs node on PATH (jsii runs provider code in node)")
    try:
        from deploy.synth import synthesize, warm

        warm(("gcp", "aws"))
    except ModuleNotFoundError as exc:
        deps.missing(f"cloud extra ({exc.name}): pip install -r requirements-cloud.txt")
    return synthesize
