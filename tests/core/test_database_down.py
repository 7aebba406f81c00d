"""The real web server while its database is out of reach: 503 with Retry-After and the documented JSON error
(HTML for the UI), never a 500, nothing half-saved, and the next request after it is back answers normally.

The web server (gunicorn, as `make run` serves) reaches PostgreSQL through a TCP relay in this test; cutting
the relay closes every connection and refuses new ones, which is what the web server sees when PostgreSQL
is stopped, restarted or failed over (the suite's own server cannot be stopped: other tests use it)."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from django.db import connection
from django.test import Client

from apps.balancers.models import LoadBalancer
from apps.core.webserver import gunicorn_command
from tests.netutil import pick_free_port
from tests.processes import REPO, process_env, stop_process
from tests.relay import Relay

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]


def _request(url: str, *, token: str | None = None, cookie: str | None = None, data: dict | None = None,
             ) -> tuple[int, dict[str, str], bytes]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if cookie:
        headers["Cookie"] = cookie
    body = None
    if data is not None:
        body, headers["Content-Type"] = json.dumps(data).encode(), "application/json"
    request = urllib.request.Request(url, data=body, headers=headers)  # noqa: S310 (our own server)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            return response.status, {k.lower(): v for k, v in response.headers.items()}, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


@contextlib.contextmanager
def _web_server(relay: Relay, **env: str) -> Iterator[str]:
    """Real gunicorn (as `make run` serves) with `env` pointing it at the relay; its base URL once it answers."""
    port = pick_free_port()
    proc = subprocess.Popen(gunicorn_command(f"127.0.0.1:{port}", workers=1), cwd=REPO,
                            env=process_env(DEBUG="0", WEB_THREADS="2", **env),
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            with contextlib.suppress(OSError):
                if _request(f"{base}/healthz")[0] == 200:
                    break
            assert proc.poll() is None and time.monotonic() < deadline, "web server did not start"
            time.sleep(0.2)
        yield base
    finally:
        stop_process(proc)
        relay.cut()


@pytest.fixture
def relay_server() -> Iterator[tuple[str, Relay]]:
    s = connection.settings_dict
    relay = Relay((s["HOST"] or "127.0.0.1", int(s["PORT"] or 5432)))
    with _web_server(relay, DATABASE_URL=f"postgres://{s['USER']}@127.0.0.1:{relay.port}/{s['NAME']}") as base:
        yield base, relay


def test_with_the_database_out_of_reach_the_api_and_the_ui_answer_503_with_retry_after_then_recover(
    relay_server, alice
) -> None:
    base, relay = relay_server
    web = Client()
    web.force_login(alice.user)  # a session in the database, as a signed-in operator's browser has
    cookie = f"sessionid={web.cookies['sessionid'].value}"
    lbs = f"{base}/api/v1/load-balancers/"
    assert _request(lbs, token=alice.token)[0] == 200
    assert _request(f"{base}/", cookie=cookie)[0] == 200

    relay.cut()
    for _ in range(3):  # every request thread's connection, not only the first one's
        status, headers, body = _request(lbs, token=alice.token)
        assert status == 503, body[:500]
        assert headers["retry-after"] == "5"
        error = json.loads(body)
        assert error["code"] == "unavailable" and "database" in error["detail"]
    status, headers, body = _request(lbs, token=alice.token, data={"name": "written-while-down"})
    assert (status, json.loads(body)["code"]) == (503, "unavailable")
    status, headers, body = _request(f"{base}/", cookie=cookie)  # the UI: its session is in the database
    assert status == 503 and headers["retry-after"] == "5"
    assert b"briefly unavailable" in body and b"Traceback" not in body

    relay.mend()
    statuses = [_request(lbs, token=alice.token)[0] for _ in range(4)]
    assert statuses == [200] * 4  # each thread's broken connection is noticed at the request's start
    assert _request(f"{base}/", cookie=cookie)[0] == 200
    assert _request(lbs, token=alice.token, data={"name": "written-after"})[0] == 201
    assert not LoadBalancer.objects.filter(name="written-while-down").exists()


@pytest.fixture
def redis_relay_server() -> Iterator[tuple[str, Relay]]:
    base_url, _, db = os.environ["REDIS_URL"].rpartition("/")
    host, _, port = base_url.rpartition("//")[2].rpartition(":")
    relay = Relay((host or "127.0.0.1", int(port or 6379)))
    with _web_server(relay, REDIS_URL=f"redis://127.0.0.1:{relay.port}/{db}") as base:
        yield base, relay


def test_with_redis_out_of_reach_a_route_write_is_saved_and_answered_and_the_next_change_queues_the_reconcile(
    redis_relay_server, alice, acme
) -> None:
    """Redis is the broker: the reconcile a route change queues after its commit cannot be sent. The write is
    saved and answered (not a 500 after a commit: a client retrying would write it twice), and the change is
    left for the next reconcile (the periodic converge, or the next change once Redis is back)."""
    from apps.balancers.models import Pool, Region
    from apps.fleets.models import Fleet

    region = Region.objects.create(slug="us-east", name="US East")
    fleet = Fleet.objects.create(name="edge", region=region)
    lb = LoadBalancer.objects.create(org=acme, name="web", fleet=fleet)
    pool = Pool.objects.create(lb=lb, org=acme, name="web")
    base, relay = redis_relay_server
    body = {"lb": lb.pk, "path": "/while-redis-down", "priority": 10, "targets": [{"pool": pool.pk, "weight": 100}]}
    relay.cut()
    started = time.monotonic()
    status, _, answer = _request(f"{base}/api/v1/routes/", token=alice.token, data=body)
    took = time.monotonic() - started
    assert status == 201, answer[:500]
    assert took < 10, f"the write waited {took:.1f} s for the broker"
    fleet.refresh_from_db()
    assert fleet.change_seq > fleet.rendered_seq  # recorded for the next reconcile
    assert not fleet.reconcile_queued  # nothing is queued: the next change (or the converge) queues one

    relay.mend()
    body["path"], body["priority"] = "/after", 11
    assert _request(f"{base}/api/v1/routes/", token=alice.token, data=body)[0] == 201
    fleet.refresh_from_db()
    assert fleet.reconcile_queued  # sent this time (it renders both changes)
