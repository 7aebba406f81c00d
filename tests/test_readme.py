"""Every command README.md shows works as written.

Each command of the README's code blocks is run here or by the test named next to it; a command
nobody runs fails `test_every_readme_command_is_run_by_a_test`, so a new one cannot be added unchecked.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from django.db import connection
from rest_framework.test import APIClient

from apps.accounts.models import ApiToken
from apps.balancers import demo as balancers_demo
from tests import readme
from tests.processes import REPO

# command prefix -> where it is run
RUN_BY = {
    "make run": "tests/test_make_run.py (the real one, on a scratch var/, stopped with Ctrl-C)",
    "make test": "test_make_targets_exist_as_shown (dry run: this is that run)",
    ".venv/bin/python manage.py mktoken": "test_mktoken_works_as_shown_after_make_run and tests/test_make_run.py",
    "curl -H 'Host: acme.example.com' http://127.0.40.1:8080/": "tests/fleets/test_demo.py and tests/test_make_run.py",
    "gunicorn controlplane.asgi:application": "test_the_production_command_is_the_one_make_run_serves "
                                              "(tests/fleets/test_longpoll_server.py runs that command)",
}


def test_every_readme_command_is_run_by_a_test() -> None:
    unchecked = [c for c in readme.commands() if not any(c.startswith(prefix) for prefix in RUN_BY)]
    assert unchecked == [], f"README commands no test runs: {unchecked}"


def test_the_production_command_is_the_one_make_run_serves() -> None:
    from apps.core.webserver import gunicorn_command

    shown = shlex.split(readme.command("gunicorn controlplane.asgi:application"))
    assert shown[1:] == gunicorn_command("0.0.0.0:8000")[3:]  # built: <python> -m gunicorn ...


def test_make_targets_exist_as_shown() -> None:
    for cmd in ("make run", "make test"):
        line = readme.command(cmd)
        result = subprocess.run([*line.split(), "-n"], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "scripts/setup-system" in result.stdout  # both set the machine up first


@pytest.mark.django_db(transaction=True)
def test_mktoken_works_as_shown_after_make_run(tmp_path) -> None:
    """After `make run` wrote var/local.env, the README's command needs no DEBUG=1 or SECRET_KEY."""
    balancers_demo.load_demo()  # the demo org `acme`, as `make run` loads it
    env = {k: v for k, v in os.environ.items()
           if k not in ("DEBUG", "SECRET_KEY", "FIELD_ENCRYPTION_KEY", "SPILLWAY_TESTING", "DJANGO_SETTINGS_MODULE")}
    s = connection.settings_dict
    env["DATABASE_URL"] = f"postgres://{s['USER']}@{s['HOST'] or '127.0.0.1'}:{s['PORT'] or 5432}/{s['NAME']}"
    env["SPILLWAY_VAR_DIR"] = str(tmp_path / "var")  # a scratch var/: make run's local.env goes there
    first = subprocess.run([sys.executable, "controlplane/localenv.py"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "var" / "local.env").stat().st_mode & 0o777 == 0o600
    line = readme.command(".venv/bin/python manage.py mktoken")
    result = subprocess.run(shlex.split(line), cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    secret = result.stdout.strip()
    assert ApiToken.objects.filter(org__slug="acme").count() == 1
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert client.get("/api/v1/load-balancers/").status_code == 200
