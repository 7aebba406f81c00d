"""Shared setup for the fleet benchmarks: a fresh database, 2 regions x N local HAProxy nodes,
small HTTP backends, a real Celery worker and a real gunicorn serving the API. Loopback only;
everything started here is stopped by PID in `close()`.

The nodes' directories (their "disks") are made in /tmp, or in BENCH_NODES_DIR (e.g. /dev/shm/spw, an existing
directory). This machine kind's root ext4 has no journal, so its inode allocator skips every inode freed in the last
30 s (ext4's recently_deleted()) and a file created there costs ~0.7-1.1 ms of kernel CPU after churn (0.01 ms on
tmpfs): on /tmp, part of what a bench counts per node is that local disk's, which a remote node's own disk bears.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from apps.core.webserver import gunicorn_command  # noqa: E402
from tests.netutil import free_port_on, pick_free_port  # noqa: E402

# Regions a bench's fleets stand in, and their round trips (ms) as the planner reads them.
REGION_SLUGS = ("us-east", "eu-west", "ap-south")
REGION_RTT_MS = {("us-east", "eu-west"): 80, ("us-east", "ap-south"): 190, ("eu-west", "ap-south"): 120}

DB_URL_BASE = os.environ.get("BENCH_DATABASE_SERVER", "postgres://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/2")


async def _serve_fast(specs: list[tuple[str, str]]) -> None:
    """asyncio backends: a fixed 200 per request, keep-alive, one process for all of them."""
    import asyncio

    class Answer(asyncio.Protocol):
        def __init__(self, body: bytes) -> None:
            self.response = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
            self.buffer = b""

        def connection_made(self, transport) -> None:  # type: ignore[no-untyped-def]
            self.transport = transport

        def data_received(self, data: bytes) -> None:
            self.buffer += data
            while b"\r\n\r\n" in self.buffer:  # GET requests: no body
                _, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
                self.transport.write(self.response)

    loop = asyncio.get_running_loop()
    for name, address in specs:
        server = await loop.create_server(lambda n=name: Answer(n.encode()), address, 0, backlog=1024)
        print(f"{name} {address} {server.sockets[0].getsockname()[1]}", flush=True)
    print("READY", flush=True)
    await asyncio.Event().wait()


def start_fast_backends(specs: list[tuple[str, str]]) -> tuple[subprocess.Popen, dict[tuple[str, str], int]]:
    """Start the asyncio backends in their own process (no GIL shared with the bench); {(name, address): port}."""
    arg = ",".join(f"{n}@{a}" for n, a in specs)
    proc = subprocess.Popen([sys.executable, __file__, "backends", arg], stdout=subprocess.PIPE, text=True)
    ports: dict[tuple[str, str], int] = {}
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.strip() == "READY":
            return proc, ports
        name, address, port = line.split()
        ports[(name, address)] = int(port)
    raise RuntimeError("fast backends did not start")


def child_result(script: str, args: list[str], what: str) -> dict:
    """Run `script` with `args` in a child process of its own (a fresh database and control plane each) and return
    the JSON it printed after "RESULT-JSON "; exit with its output when it printed none."""
    child = subprocess.run([sys.executable, script, *args], capture_output=True, text=True, check=False)
    line = next((x for x in child.stdout.splitlines() if x.startswith(CHILD_MARK)), None)
    if line is None:
        print(child.stdout[-3000:], child.stderr[-3000:], sep="\n")
        raise SystemExit(f"{what}: the run failed (exit {child.returncode})")
    return json.loads(line[len(CHILD_MARK):])


CHILD_MARK = "RESULT-JSON "


def http_get(host: str, port: int, path: str, timeout_s: float = 1.0) -> tuple[int, str]:
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request("GET", path, headers={"Connection": "close"})
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError as exc:
        return 0, str(exc)
    finally:
        conn.close()


def _recreate_database(name: str) -> None:
    import psycopg

    with psycopg.connect(f"{DB_URL_BASE}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


class FleetBench:
    """2 regions (us-east, eu-west) x `nodes_per_region` local nodes serving LB `bench`.

    With `topology=False` only the operator org, its user and API token exist: the bench builds
    regions, fleets, nodes, the LB and its pools through the API (`api`) and starts each local
    node's HAProxy master with `start_node` (what a node's host does, not Spillway). With
    `beat=True` Celery beat and the enforcer process run too, so periodic tasks (health) and the
    enforcement loop run as in production."""

    def __init__(self, db_name: str, nodes_per_region: int = 3, worker_concurrency: int = 2, *,
                 topology: bool = True, beat: bool = False, regions: int = 2, own_sessions: bool = False) -> None:
        self.own_sessions = own_sessions  # each worker in a process group and session of its own (bench_scaleout)
        self.procs: list[subprocess.Popen] = []
        self.masters: list[subprocess.Popen] = []
        self.fleets: list = []
        self.lb_id: int | None = None
        self.base = tempfile.mkdtemp(prefix="spw-bench-", dir=os.environ.get("BENCH_NODES_DIR", "/tmp"))
        self.env = dict(os.environ)
        self.env.update({
            "DATABASE_URL": f"{DB_URL_BASE}/{db_name}", "REDIS_URL": REDIS_URL,
            "SECRET_KEY": "bench-only-secret-key", "FIELD_ENCRYPTION_KEY": "bench-only-field-key",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings", "SPILLWAY_VAR_DIR": f"{self.base}/var",
            "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),  # INFO: the pipeline's timings
        })
        os.environ.update(self.env)
        _recreate_database(db_name)
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        try:
            self._bootstrap()
            if topology:
                self._build(nodes_per_region, regions)
            self._start_worker(worker_concurrency)
            if beat:
                self._start_beat()
                self._start_enforcer()
            self._start_web()
        except BaseException:
            self.close()  # whatever was started is stopped by PID
            raise

    # --- setup -------------------------------------------------------------------------------
    def _bootstrap(self) -> None:
        from apps.accounts.models import Organization, Role
        from apps.accounts.services import token_create, user_create_with_membership

        self.ops = Organization.objects.create(slug="ops", name="Ops", kind="operator")
        user_create_with_membership(username="bench", password="bench-password-123", org=self.ops, role=Role.ADMIN)
        self.token = token_create(org=self.ops, name="bench", scopes=["read", "write", "deploy"]).secret

    def _build(self, nodes_per_region: int, region_count: int = 2) -> None:
        from apps.balancers.models import (
            Listener,
            LoadBalancer,
            Member,
            Pool,
            PoolRegion,
            Region,
            RegionDistance,
        )
        from apps.fleets.demo.localnodes import start_local_node
        from apps.fleets.models import Fleet, Node

        ops = self.ops
        slugs = REGION_SLUGS[:region_count]
        regions = {slug: Region.objects.create(slug=slug, name=slug) for slug in slugs}
        for i, src in enumerate(slugs):
            for dst in slugs[i + 1:]:
                RegionDistance.objects.create(src=regions[src], dst=regions[dst], rtt_ms=REGION_RTT_MS[src, dst])
        fleets = [Fleet.objects.create(name=f"{slug}-fleet", region=region) for slug, region in regions.items()]
        self.lb = LoadBalancer.objects.create(org=ops, name="bench", fleet=fleets[0])
        for fleet in fleets[1:]:
            fleet.serves.add(self.lb)
        self.lb_id = self.lb.pk
        pools = {}
        # One backend per pool and region (a member's endpoint is unique within its pool).
        specs = [(name, f"127.0.90.{1 + n + 2 * r}") for n, name in enumerate(("old", "new"))
                 for r in range(region_count)]
        backends, ports = start_fast_backends(specs)
        self.procs.append(backends)
        for n, name in enumerate(("old", "new")):
            pool = Pool.objects.create(lb=self.lb, org=ops, name=name, health_path="")
            for r, (slug, region) in enumerate(regions.items()):
                address = f"127.0.90.{1 + n + 2 * r}"
                PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=None)
                Member.objects.create(pool=pool, region=region, name=f"{name}-{slug}", address=address,
                                      port=ports[(name, address)])
            pools[name] = pool
        self.pools = pools
        self.node_addresses = [f"127.0.{91 + r}.{i}" for r in range(region_count)
                               for i in range(1, nodes_per_region + 1)]
        self.port = free_port_on(self.node_addresses)
        Listener.objects.create(lb=self.lb, name="http", port=self.port, default_pool=pools["old"])
        self.fleets = fleets
        for r, fleet in enumerate(fleets):
            for i in range(1, nodes_per_region + 1):
                address = f"127.0.{91 + r}.{i}"
                node = Node.objects.create(fleet=fleet, name=f"n{i}", address=address, bind_address=address,
                                           runtime_dir=f"{self.base}/{fleet.name}/n{i}/run",
                                           config_dir=f"{self.base}/{fleet.name}/n{i}/etc")
                self.masters.append(start_local_node(node))

    def _start_worker(self, concurrency: int) -> None:
        """The workers `make run` starts (runall.worker_commands): the default queue on a prefork pool of
        `concurrency` processes, one process per fleet shard queue, and ACME's one slot."""
        from django.conf import settings

        workers = [
            ("worker", ["--queues", "celery", "--pool", "prefork", "--concurrency", str(concurrency)]),
            *((f"fleets-worker-{shard}", ["--queues", queue, "--pool", "threads", "--concurrency", "2"])
              for shard, queue in enumerate(settings.FLEET_QUEUES)),
            ("acme-worker", ["--queues", "acme", "--pool", "prefork", "--concurrency", "1"]),
        ]
        for name, options in workers:
            log = open(f"{self.base}/{name}.log", "wb")  # noqa: SIM115
            proc = subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "controlplane", "worker", *options, "--purge",
                 "--without-gossip", "--without-mingle",
                 "--loglevel", self.env["LOG_LEVEL"], "--hostname", f"bench-{name}@%h"],
                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=self.own_sessions)
            self.procs.append(proc)
        self._wait(lambda: self._worker_ready(len(workers)), 60, "celery workers")

    def _start_beat(self) -> None:
        log = open(f"{self.base}/beat.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "controlplane", "beat", "--loglevel", "WARNING"],
            cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)

    def _start_enforcer(self) -> None:
        log = open(f"{self.base}/enforcer.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen([sys.executable, str(REPO / "manage.py"), "enforcer"],
                                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)

    def start_node(self, node_id: int) -> None:
        """Start a local node's HAProxy master on an empty config (its host's job, before the first rollout)."""
        from apps.fleets.demo.localnodes import start_local_node
        from apps.fleets.models import Node

        self.masters.append(start_local_node(Node.objects.select_related("fleet__region").get(pk=node_id)))

    def _worker_ready(self, count: int = 1) -> bool:
        from controlplane.celery import app

        with contextlib.suppress(Exception):
            return len(app.control.ping(timeout=0.5)) >= count
        return False

    def _start_web(self) -> None:
        self.web_port = pick_free_port()
        log = open(f"{self.base}/web.log", "wb")  # noqa: SIM115
        # The production web server (README, `make run`): ASGI, 2 processes, long-polls parked without a thread.
        proc = subprocess.Popen(gunicorn_command(f"127.0.0.1:{self.web_port}"),
                                cwd=REPO, env=self.env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        self._wait(lambda: http_get("127.0.0.1", self.web_port, "/healthz")[0] == 200, 60, "gunicorn")

    @staticmethod
    def _wait(predicate, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{what} did not start within {timeout_s:.0f}s")

    # --- API and nodes ----------------------------------------------------------------------------
    def api(self, method: str, path: str, body: dict | None = None, timeout_s: float = 30.0,
            token: str | None = None) -> tuple[int, dict]:
        """One API call as the operator (or as whoever `token` belongs to)."""
        conn = http.client.HTTPConnection("127.0.0.1", self.web_port, timeout=timeout_s)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Authorization": f"Bearer {token or self.token}",
                                  "Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
            return response.status, json.loads(raw) if raw else {}
        finally:
            conn.close()

    def add_route(self, path: str, priority: int, redirect_url: str | None = None) -> int:
        body: dict = {"lb": self.lb.pk, "path": path, "priority": priority}
        if redirect_url:
            body["redirect_url"] = redirect_url
        else:
            body["targets"] = [{"pool": self.pools["new"].pk, "weight": 100}]
        status, body = self.api("POST", "/api/v1/routes/", body)
        if status != 201:
            raise RuntimeError(f"route create failed: {status} {body}")
        return int(body["id"])

    def wait_applied(self, timeout_s: int = 30, lb_id: int | None = None) -> None:
        """Block until every node serves the LB's current revision (the pipelines' long-poll API).

        The server caps one long-poll at APPLIED_MAX_TIMEOUT_S (60 s) and then answers 202, so a
        longer wait (the first rollout of 100k routes) asks again until `timeout_s` has passed."""
        lb_id = lb_id or self.lb_id
        _, lb = self.api("GET", f"/api/v1/load-balancers/{lb_id}/")
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(1, min(60, int(deadline - time.monotonic())))
            status, body = self.api("GET", f"/api/v1/load-balancers/{lb_id}/applied/"
                                           f"?revision={lb['revision']}&timeout={left}",
                                    timeout_s=left + 15)  # the long-poll answers first
            if status == 200:
                return
            if status != 202 or time.monotonic() >= deadline:
                raise RuntimeError(f"revision {lb['revision']} not applied within {timeout_s}s: {status} {body}")

    def wait_served(self, path: str, want: str | int, timeout_s: float = 30.0, interval_s: float = 0.005,
                    not_before: float = 0.0) -> float:
        """Seconds (monotonic clock) at which the last node first answered `want` on `path`
        (a body, or a status code when `want` is an int). Polling starts at `not_before` (monotonic):
        probes cost CPU on a 2-core box, so none are sent while nothing can have changed yet."""
        done: dict[str, float] = {}
        deadline = time.monotonic() + timeout_s
        time.sleep(max(0.0, not_before - time.monotonic()))

        def poll(address: str) -> None:
            while time.monotonic() < deadline:
                status, body = http_get(address, self.port, path, 0.5)
                if (status if isinstance(want, int) else body) == want:
                    done[address] = time.monotonic()
                    return
                time.sleep(interval_s)

        threads = [threading.Thread(target=poll, args=(a,)) for a in self.node_addresses]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if len(done) != len(self.node_addresses):
            missing = sorted(set(self.node_addresses) - set(done))
            raise RuntimeError(f"{path} not served as {want!r} by {missing} within {timeout_s:.0f}s")
        return max(done.values())

    def initial_rollout(self) -> None:
        from apps.fleets import services

        for fleet in self.fleets:
            services.fleet_mark_changed(fleet=fleet)
        self.wait_served("/", "old", 60)

    def close(self) -> None:
        from apps.fleets.demo.localnodes import stop_local_node

        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
        for master in self.masters:
            with contextlib.suppress(Exception):
                stop_local_node(master)
        # The web and worker logs outlive the run (a 500 from the API is explained only there).
        for name in ("web.log", "worker.log", "fleets-worker-0.log", "fleets-worker-1.log", "acme-worker.log"):
            with contextlib.suppress(OSError):
                shutil.copy(f"{self.base}/{name}", f"/tmp/spillway-bench-{os.getpid()}-{name}")
        shutil.rmtree(self.base, ignore_errors=True)


if __name__ == "__main__" and len(sys.argv) == 3 and sys.argv[1] == "backends":
    import asyncio

    try:
        import uvloop

        uvloop.install()
    except ImportError:
        pass
    asyncio.run(_serve_fast([tuple(item.split("@")) for item in sys.argv[2].split(",")]))  # type: ignore[misc]
