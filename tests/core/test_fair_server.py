"""Fair turns under the real web server (`gunicorn -k asgi`, one process, 4 request threads, as `make run` serves
each process): one tenant's burst of writes does not hold another tenant's request behind it, and a tenant's
many tokens share one turn. The rotation itself: tests/core/test_fair_turns.py."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from apps.accounts.services import token_create
from tests.factories import HostnameClaimFactory, LoadBalancerFactory, PoolFactory
from tests.netutil import pick_free_port
from tests.processes import REPO, process_env, stop_process

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.process]

BURST = 80


@pytest.fixture
def server(transactional_db) -> str:
    import subprocess

    from apps.core.webserver import gunicorn_command

    port = pick_free_port()
    env = process_env(DEBUG="0", WEB_THREADS="4")
    proc = subprocess.Popen(gunicorn_command(f"127.0.0.1:{port}", workers=1), cwd=REPO, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while _call("GET", f"http://127.0.0.1:{port}/healthz", None)[0] != 200:
            assert proc.poll() is None and time.monotonic() < deadline, "web server did not start"
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        stop_process(proc)


def _call(method: str, url: str, token: str | None, body: dict | None = None) -> tuple[int, float]:
    """(status, monotonic time of the answer)."""
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=60) as response:  # noqa: S310  (our own server)
            response.read()
            return response.status, time.monotonic()
    except urllib.error.HTTPError as exc:
        return exc.code, time.monotonic()
    except OSError:
        return 0, time.monotonic()


def _route(lb, pool, n: int, slug: str) -> dict:
    return {"lb": lb.pk, "hosts": [f"r{n}.{slug}.test"], "path": "/",
            "targets": [{"pool": pool.pk, "weight": 100}]}


def test_a_tenants_burst_does_not_hold_another_tenants_write_behind_it(server, alice, charlie) -> None:
    """GIVEN acme sending 80 route creates at once to one LB (they run one at a time behind its lock) from 4
    tokens, WHEN globex creates a route while most of the burst still waits, THEN globex's answer comes before
    most of acme's (first come, first served it came after all of them), and every write of both is made."""
    acme_lb = LoadBalancerFactory(org=alice.org, name="acme-lb")
    acme_pool = PoolFactory(lb=acme_lb, org=alice.org, name="web")
    globex_lb = LoadBalancerFactory(org=charlie.org, name="globex-lb")
    globex_pool = PoolFactory(lb=globex_lb, org=charlie.org, name="web")
    HostnameClaimFactory(org=alice.org, hostname="*.acme.test")
    HostnameClaimFactory(org=charlie.org, hostname="*.globex.test")
    tokens = [alice.token] + [token_create(org=alice.org, name=f"t{i}", scopes=["read", "write"],
                                           user=alice.user).secret for i in range(3)]
    url = f"{server}/api/v1/routes/"
    # Each token's first request proves its org (until then it waits with its address's requests).
    for i, token in enumerate(tokens):
        assert _call("POST", url, token, _route(acme_lb, acme_pool, 1000 + i, "acme"))[0] == 201
    assert _call("POST", url, charlie.token, _route(globex_lb, globex_pool, 1000, "globex"))[0] == 201

    with ThreadPoolExecutor(BURST) as pool:
        burst = [pool.submit(_call, "POST", url, tokens[i % 4], _route(acme_lb, acme_pool, i, "acme"))
                 for i in range(BURST)]
        while not any(f.done() for f in burst):  # the burst is sent and being served
            time.sleep(0.005)
        status, answered = _call("POST", url, charlie.token, _route(globex_lb, globex_pool, 1, "globex"))
        done = [f.result() for f in burst]
    assert status == 201
    assert [s for s, _ in done] == [201] * BURST
    after = sum(1 for _, t in done if t > answered)
    assert after >= BURST // 4, f"only {after} of acme's {BURST} writes were answered after globex's"
