"""Django's system checks pass on the settings every process uses. Celery workers run them at start in
production; the workers the suite starts skip them (tests/processes.process_env), so they run here, once."""

from __future__ import annotations

import io

from django.core.management import call_command


def test_system_checks_find_nothing():
    out = io.StringIO()
    call_command("check", stdout=out)
    assert "no issues" in out.getvalue()
