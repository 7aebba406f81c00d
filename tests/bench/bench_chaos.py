"""The whole product while its parts fail: 2 regions x 3 SSH nodes in network namespaces, traffic, writes, jobs.

Everything runs as in production and is supervised by this bench (kill -9, restart after ~2 s):

- its OWN PostgreSQL cluster (initdb into a temp dir as the `postgres` OS user, a free port) and its OWN
  `redis-server` (a free port, no persistence), so both can be restarted and held down; the machine's
  PostgreSQL on 5432 and Redis on 6379 (the suite's) are never touched;
- two of every Spillway process kind where the product allows it: two gunicorn web servers (each as
  apps/core/webserver.py starts it, on its own port), two default workers, TWO workers per fleet shard queue,
  two events workers, two acme workers (runall.worker_commands, each with its own --hostname), two beats and
  two enforcers (`manage.py enforcer`);
- 6 hosts (tests/netns.py Topology: sshd, HAProxy master, keepalived, a loopback backend each), n1-n3 in
  region a (fleet fa), n4-n6 in region b (fleet fb), reached by the fleet workers over SSH.

Built through the API: LB `edge` (operator) on port 80 whose default pool `web` is capacity-limited in region
a (max_rate_per_member 20, one member) so the traffic wrk sends through every node (bounded: a Lua delay, 2
connections per node) overflows to region b while the enforcer runs; LBs `t1` and `t2` of two customer orgs
(ports 8081, 8082) with a pool each and no default pool (an unknown path answers 404). The tenants write routes
through the API at --rate writes/min in all (alternating / failing over between the two web servers, with an
Idempotency-Key): write N adds `/c<N>` to the tenant's pool, whose backends answer `t1-a`/`t1-b`, so a GET of
/c<N> through a node says whether the write is live there. A noop job of t1 runs every minute (cron, misfire
policy run_once).

Faults, each alone, then a few together (--quick: one of each family, short outages): kill -9 (process group)
of each process kind in turn (of its two instances, the one holding the kind's lease when its log says so:
beat leader, enforcer, fleet shard), restarted after ~2 s; PostgreSQL restarted and down for 30 s; Redis
restarted and down for 30 s; a node cut off (its veth down) and a node rebooted (Topology.kill_host /
start_host: back from its own files); the whole control plane stopped for --cp-stop-min minutes (SIGTERM), a
node rebooting meanwhile. A process that exits on its own is restarted after ~2 s too, and reported.

Figures (per fault as it goes, then the last line):
- dataplane_errors: wrk socket errors + non-2xx on every node but the one deliberately cut off or rebooted
  in that phase (that node's own errors are printed apart);
- lost_changes: writes answered 2xx that are not live on every node at the end (a GET of every write
  through every node, after the final settle);
- api_500 / api_503: answers 500 / 503 to the writers (503s are checked for Retry-After and a JSON body);
- converge_s_max: from the end of a fault until every node's applied revision (database) reaches its fleet's
  desired revision as of that moment AND the last write answered before it is live on every node (HTTP);
- change_delay_s_max: per write, from its 2xx until it is live on every node not faulted meanwhile; max over
  the baseline and single-process-kill phases (goal <= 5 s); node and outage phases are printed apart
  (change_delay_node_s_max, change_delay_outage_s_max);
- jobs_duplicate / jobs_missed: per minute slot of the job, runs covering it (a catch-up run covers the
  slots it stands for) and runs executed more than once; 0 and 0 expected.

    python tests/bench/bench_chaos.py [--quick] [--cp-stop-min 5] [--rate 1000]

Goals: dataplane_errors=0, lost_changes=0, api_500=0, converge_s_max <= 10, change_delay_s_max <= 5,
jobs 0/0; exits 1 when one is missed. Needs root (network namespaces, the own PostgreSQL). Full run ~16 min,
--quick ~6 min (7-8 with --cp-stop-min 3). Kept in /tmp/spillway-chaos-<pid>/: every process's log,
writes.csv (each write: answer, revision, when it was live on each node), phases.txt, jobruns.txt.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import glob
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.bench._fleetbench import start_fast_backends  # noqa: E402
from tests.netutil import pick_free_port  # noqa: E402

GOALS = {"dataplane_errors": 0, "lost_changes": 0, "api_500": 0, "converge_s_max": 10.0,
         "change_delay_s_max": 5.0, "jobs_duplicate": 0, "jobs_missed": 0}
EDGE_PORT, TENANT_PORTS = 80, (8081, 8082)
TENANTS = ("t1", "t2")
RESTART_AFTER_S = 2.0
WRK_DELAY_MS = 50  # per connection: ~20 req/s, 2 connections per node
_SOCKET_RE = re.compile(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)")
_NON2XX_RE = re.compile(r"Non-2xx or 3xx responses: (\d+)")
_REQUESTS_RE = re.compile(r"(\d+) requests in")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


# --- the bench's own PostgreSQL and Redis ---------------------------------------------------------------------
def _pg_bin(name: str) -> str:
    for candidate in (f"/usr/local/bin/{name}", *sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)):
        if os.path.exists(candidate):
            return candidate
    raise SystemExit(f"cannot run: no PostgreSQL {name} in /usr/local/bin or /usr/lib/postgresql/*/bin")


class PgServer:
    """A throw-away cluster owned by the `postgres` OS user, on a free loopback port."""

    def __init__(self, base: Path) -> None:
        self.dir = base / "pg"
        self.data = self.dir / "data"
        self.port = pick_free_port()
        self.proc: subprocess.Popen | None = None
        self.log = base / "postgres.log"

    def init(self) -> None:
        self.dir.mkdir(mode=0o755)
        shutil.chown(self.dir, "postgres", "postgres")
        sh("runuser", "-u", "postgres", "--", _pg_bin("initdb"), "-D", str(self.data), "-U", "postgres",
           "-A", "trust", "-E", "UTF8", "--no-sync")

    def start(self) -> None:
        logf = self.log.open("ab")
        self.proc = subprocess.Popen(
            ["runuser", "-u", "postgres", "--", _pg_bin("postgres"), "-D", str(self.data), "-p", str(self.port),
             "-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.dir}",
             "-c", "max_connections=400", "-c", "fsync=off", "-c", "synchronous_commit=off",
             "-c", "full_page_writes=off", "-c", "shared_buffers=128MB"],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + 60
        while not self.ready():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"own PostgreSQL did not start: {self.log.read_text()[-2000:]}")
            time.sleep(0.1)

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres",
                                 connect_timeout=2):
                return True
        except psycopg.Error:
            return False

    def postmaster_pid(self) -> int | None:
        with contextlib.suppress(OSError, ValueError, IndexError):
            return int((self.data / "postmaster.pid").read_text().split()[0])
        return None

    def stop(self, mode: str = "fast") -> None:
        """fast: SIGINT to the postmaster (pg_ctl -m fast); kill: SIGKILL to every process of the cluster."""
        if self.proc is None:
            return
        pid = self.postmaster_pid()
        if mode == "fast" and pid:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                mode = "kill"
        if mode == "kill" or self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(10)
        self.proc = None

    def url(self, db: str) -> str:
        return f"postgres://postgres@127.0.0.1:{self.port}/{db}"


class RedisServer:
    def __init__(self, base: Path) -> None:
        self.port = pick_free_port()
        self.dir = base / "redis"
        self.dir.mkdir()
        self.log = base / "redis.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        logf = self.log.open("ab")
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--daemonize", "no", "--dir", str(self.dir), "--protected-mode", "no"],
            stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        logf.close()
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError), socket_connect("127.0.0.1", self.port) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return
            if time.monotonic() > deadline:
                raise RuntimeError("own redis-server did not start")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(5)
        self.proc = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"


def socket_connect(host: str, port: int, timeout: float = 1.0):
    import socket

    return socket.create_connection((host, port), timeout=timeout)


# --- the supervisor ------------------------------------------------------------------------------------------------
@dataclass
class Proc:
    kind: str
    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen | None = None
    starts: int = 0
    expected_down: bool = True  # killed or stopped by the bench (not a crash)
    restart_at: float | None = None  # a crash: restarted then (the supervisor's ~2 s)


class Supervisor:
    """Starts each process in its own process group; kill -9 takes the whole group (as a service manager does)."""

    def __init__(self, env: dict[str, str], logdir: Path) -> None:
        self.env, self.logdir = env, logdir
        self.procs: list[Proc] = []
        self.lock = threading.RLock()
        self.crashes: list[tuple[float, str, int | None]] = []  # (monotonic, name, returncode)
        self.stopping = threading.Event()
        self.monitor = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        """A process that exits on its own is restarted after RESTART_AFTER_S, as a service manager would."""
        while not self.stopping.wait(0.5):
            with self.lock:
                now = time.monotonic()
                for p in self.procs:
                    if p.popen is not None and not p.expected_down and p.popen.poll() is not None:
                        rc = p.popen.returncode
                        self.kill9(p)  # what is left of its group
                        p.restart_at = now + RESTART_AFTER_S
                        self.crashes.append((now, p.name, rc))
                        log(f"  !! {p.name} exited on its own (rc {rc}); restarting it in {RESTART_AFTER_S:.0f} s")
                    elif p.restart_at is not None and now >= p.restart_at and p.popen is None:
                        self.start(p)

    def add(self, kind: str, name: str, argv: list[str]) -> Proc:
        proc = Proc(kind, name, argv, self.logdir / f"{name}.log")
        self.procs.append(proc)
        return proc

    def of(self, kind: str) -> list[Proc]:
        return [p for p in self.procs if p.kind == kind]

    def kinds(self) -> list[str]:
        return list(dict.fromkeys(p.kind for p in self.procs))

    def start(self, proc: Proc) -> None:
        with self.lock:
            self._start(proc)

    def _start(self, proc: Proc) -> None:
        proc.expected_down, proc.restart_at = False, None
        logf = proc.log.open("ab")
        logf.write(f"\n===== chaos bench: start #{proc.starts + 1} at {time.strftime('%H:%M:%S')} =====\n".encode())
        logf.flush()
        proc.popen = subprocess.Popen(proc.argv, cwd=REPO, env=self.env, stdout=logf, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        logf.close()
        proc.starts += 1

    def kill9(self, proc: Proc) -> None:
        with self.lock:
            proc.expected_down, proc.restart_at = True, None
            self._kill9(proc)

    def _kill9(self, proc: Proc) -> None:
        if proc.popen is None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.popen.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.popen.wait(10)
        proc.popen = None

    def stop_all(self) -> None:
        with self.lock:
            for p in self.procs:
                p.expected_down, p.restart_at = True, None
            live = [p for p in self.procs if p.popen is not None]
        for p in live:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.popen.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            self.kill9(p)



def build_processes(sup: Supervisor, web_ports: list[int]) -> None:
    from django.conf import settings

    from apps.core.management.commands.runall import worker_commands
    from apps.core.webserver import gunicorn_command

    py = sys.executable
    for i, port in enumerate(web_ports):
        sup.add("web", f"web-{i}", gunicorn_command(f"127.0.0.1:{port}"))
    for name, argv in worker_commands(py, sqlite=False):
        kind = {"worker": "worker", "events-worker": "events", "acme-worker": "acme"}.get(name, name)
        for i in range(2):
            argv_i = list(argv)
            hostname = f"chaos-{name}-{i}@%h"
            if "--hostname" in argv_i:
                argv_i[argv_i.index("--hostname") + 1] = hostname
            else:
                argv_i += ["--hostname", hostname]
            sup.add(kind.replace("fleets-worker-", "fleets-"), f"{name}-{i}", argv_i)
    for i in range(2):
        sup.add("beat", f"beat-{i}", [py, "-m", "celery", "-A", "controlplane", "beat", "--loglevel", "INFO"])
    for i in range(2):
        sup.add("enforcer", f"enforcer-{i}", [py, str(REPO / "manage.py"), "enforcer"])
    assert len(sup.of("fleets-0")) == 2 and len(settings.FLEET_QUEUES) >= 1


# --- API -----------------------------------------------------------------------------------------------------------
class Api:
    def __init__(self, ports: list[int], token: str) -> None:
        self.ports, self.token = ports, token

    def call(self, method: str, path: str, body: dict | None = None, token: str | None = None,
             timeout_s: float = 60.0, port: int | None = None) -> tuple[int, dict, dict]:
        conn = http.client.HTTPConnection("127.0.0.1", port or self.ports[0], timeout=timeout_s)
        try:
            conn.request(method, path, body=json.dumps(body) if body is not None else None,
                         headers={"Authorization": f"Bearer {token or self.token}", "Content-Type": "application/json"})
            response = conn.getresponse()
            raw = response.read()
            try:
                data = json.loads(raw) if raw else {}
            except ValueError:
                data = {"raw": raw[:300].decode(errors="replace")}
            return response.status, data, {k.lower(): v for k, v in response.getheaders()}
        finally:
            conn.close()

    def must(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> dict:
        status, data, _ = self.call(method, path, body, token)
        if status not in (200, 201, 202):
            raise RuntimeError(f"{method} {path}: HTTP {status} {data}")
        return data

    def wait_applied(self, lb_id: int, timeout_s: float = 180.0) -> None:
        lb = self.must("GET", f"/api/v1/load-balancers/{lb_id}/")
        deadline = time.monotonic() + timeout_s
        while True:
            left = max(1, min(60, int(deadline - time.monotonic())))
            status, body, _ = self.call("GET", f"/api/v1/load-balancers/{lb_id}/applied/?revision={lb['revision']}"
                                               f"&timeout={left}", timeout_s=left + 15)
            if status == 200:
                return
            if time.monotonic() >= deadline:
                raise RuntimeError(f"LB {lb_id} revision {lb['revision']} not applied in {timeout_s:.0f}s: {body}")


# --- writers -------------------------------------------------------------------------------------------------------
@dataclass
class Write:
    k: int
    tenant: int
    path: str
    sent: float
    answered: float | None = None
    status: int = 0
    revision: int | None = None
    outcome: str = ""  # 2xx | gave_up | refused:<code>
    history: list[str] = field(default_factory=list)  # each attempt: status or conn
    latency: float | None = None  # the answered attempt's
    confirm: dict[str, float] = field(default_factory=dict)


class Writers:
    """Open-loop route writes at `rate_per_min` over both tenants; each write fails over between the web servers
    and retries on connection errors, 5xx and 409 idempotency_in_progress (same Idempotency-Key) for up to 60 s."""

    def __init__(self, ports: list[int], tenants: list[dict], rate_per_min: float, threads: int = 8) -> None:
        self.ports, self.tenants = ports, tenants
        self.interval = 60.0 / rate_per_min
        self.writes: list[Write] = []
        self.events: list[tuple[float, str, str]] = []  # (monotonic, kind, detail)
        self.lock = threading.Lock()
        self.next_k = 0
        self.dropped = 0
        self.stopping = threading.Event()
        self.paused = threading.Event()
        self.sinks: list = []  # callables taking each answered Write (the prober)
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]
        self.t0 = 0.0

    def start(self) -> None:
        self.t0 = time.monotonic()
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self.stopping.set()
        for t in self.threads:
            t.join(90)

    def _take(self) -> int | None:
        with self.lock:
            k = self.next_k
            self.next_k += 1
        due = self.t0 + k * self.interval
        wait = due - time.monotonic()
        if wait > 0:
            if self.stopping.wait(wait):
                return None
        elif -wait > 30:  # behind by 30 s (everything down): the pipeline skips that write
            with self.lock:
                self.dropped += 1
            return -1
        return k

    def _loop(self) -> None:
        while not self.stopping.is_set():
            k = self._take()
            if k is None:
                return
            if k >= 0:
                self._write(k)

    def _event(self, kind: str, detail: str = "") -> None:
        with self.lock:
            self.events.append((time.monotonic(), kind, detail))

    def _write(self, k: int) -> None:
        tenant = k % len(self.tenants)
        t = self.tenants[tenant]
        w = Write(k=k, tenant=tenant, path=f"/c{k}", sent=time.monotonic())
        with self.lock:
            self.writes.append(w)
        body = {"lb": t["lb"], "path": w.path, "path_match": "prefix", "priority": k + 1,
                "targets": [{"pool": t["pool"], "weight": 100}]}
        key = f"chaos-{k}-{uuid.uuid4().hex[:12]}"
        deadline = time.monotonic() + 60
        attempt = 0
        while True:
            port = self.ports[(k + attempt) % len(self.ports)]
            attempt += 1
            wait = 0.5
            sent = time.monotonic()
            try:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                try:
                    conn.request("POST", "/api/v1/routes/", body=json.dumps(body),
                                 headers={"Authorization": f"Bearer {t['token']}", "Content-Type": "application/json",
                                          "Idempotency-Key": key})
                    response = conn.getresponse()
                    raw = response.read()
                    status = response.status
                    headers = {h.lower(): v for h, v in response.getheaders()}
                finally:
                    conn.close()
            except OSError as exc:
                self._event("conn", f"{port}: {exc}")
                status, raw, headers = 0, b"", {}
            w.history.append(f"{status or 'conn'}@:{port}")
            if 200 <= status < 300:
                w.answered, w.status, w.outcome = time.monotonic(), status, "2xx"
                w.latency = w.answered - sent
                rev = headers.get("spillway-lb-revision")
                w.revision = int(rev) if rev and rev.isdigit() else None
                self._event("2xx")
                for sink in self.sinks:
                    sink(w)
                return
            if status == 500:
                self._event("500", f"{w.path} via :{port}: {raw[:300].decode(errors='replace')}")
            elif status == 503:
                retry_after = headers.get("retry-after", "")
                is_json = headers.get("content-type", "").startswith("application/json")
                self._event("503", "ok" if retry_after and is_json else
                            f"{w.path} via :{port}: Retry-After={retry_after!r} content-type="
                            f"{headers.get('content-type')!r} body={raw[:200]!r}")
                with contextlib.suppress(ValueError):
                    wait = min(5.0, max(0.2, float(retry_after)))
            elif status == 409 and b"idempotency_in_progress" in raw:
                self._event("409", f"{w.path}: idempotency_in_progress")
            elif status in (502, 504):
                self._event(str(status), f"{w.path} via :{port}")
            elif status != 0:
                w.status, w.outcome = status, f"refused:{status}"
                self._event(f"other:{status}", f"{w.path}: {raw[:300].decode(errors='replace')}")
                return
            if time.monotonic() + wait > deadline or self.stopping.is_set():
                w.outcome = "gave_up"
                self._event("gave_up", f"{w.path}: {' '.join(w.history[-6:])}")
                return
            time.sleep(wait)

    def counts(self, since: float, until: float) -> collections.Counter:
        with self.lock:
            return collections.Counter(kind for t, kind, _ in self.events if since <= t < until)

    def details(self, kind: str, since: float = 0.0, until: float = float("inf")) -> list[str]:
        with self.lock:
            return [f"{t - self.t0:7.1f}s {d}" for t, k, d in self.events
                    if k == kind and since <= t < until and d != "ok"]


# --- prober: is each answered write live on each node? -------------------------------------------------------------
class Conn:
    """One keep-alive HTTP/1.1 connection to a node's listener."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    async def get(self, path: str, timeout_s: float = 1.0) -> tuple[int, bytes] | None:
        try:
            if self.writer is None:
                self.reader, self.writer = await asyncio.wait_for(asyncio.open_connection(self.host, self.port),
                                                                  timeout_s)
            self.writer.write(f"GET {path} HTTP/1.1\r\nHost: chaos.test\r\n\r\n".encode())
            head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout_s)
            status = int(head.split(b" ", 2)[1])
            length, close = None, False
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and b"close" in value.lower():
                    close = True
            if length is None:
                body = await asyncio.wait_for(self.reader.read(), timeout_s)
                close = True
            else:
                body = await asyncio.wait_for(self.reader.readexactly(length), timeout_s)
            if close:
                self.close()
            return status, body
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError,
                IndexError):
            self.close()
            return None


def is_live(answer: tuple[int, bytes] | None, tenant: int) -> bool:
    return answer is not None and answer[0] == 200 and answer[1].startswith(TENANTS[tenant].encode())


class Prober(threading.Thread):
    """Per (tenant LB, node): walks the writes not yet seen live there, oldest first, every 0.2 s; three misses
    in a row end a round (later writes are not live yet either), so a lost write never blocks the others."""

    def __init__(self, hosts: list, rounds_s: float = 0.2) -> None:
        super().__init__(daemon=True)
        self.hosts = hosts
        self.rounds_s = rounds_s
        self.inbox = {(t, h.name): collections.deque() for t in range(len(TENANTS)) for h in hosts}
        self.pending_count: dict[tuple[int, str], int] = {}
        self.unreachable_at: dict[str, float] = {}
        self.stopping = threading.Event()

    def add(self, w: Write) -> None:
        for h in self.hosts:
            self.inbox[(w.tenant, h.name)].append(w)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        await asyncio.gather(*(self._watch(t, h) for t in range(len(TENANTS)) for h in self.hosts))

    async def _watch(self, tenant: int, host) -> None:
        conn = Conn(host.address, TENANT_PORTS[tenant])
        inbox = self.inbox[(tenant, host.name)]
        pending: list[Write] = []
        while not self.stopping.is_set():
            while inbox:
                pending.append(inbox.popleft())
            keep: list[Write] = []
            misses = 0
            for i, w in enumerate(pending):
                if misses >= 3 or i >= 400:
                    keep.extend(pending[i:])
                    break
                answer = await conn.get(w.path)
                if answer is None:
                    self.unreachable_at[host.name] = time.monotonic()
                    keep.extend(pending[i:])
                    break
                if is_live(answer, tenant):
                    w.confirm[host.name] = time.monotonic()
                else:
                    misses += 1
                    keep.append(w)
            pending = keep
            self.pending_count[(tenant, host.name)] = len(pending)
            await asyncio.sleep(self.rounds_s)
        conn.close()

    def backlog(self) -> int:
        return sum(self.pending_count.values()) + sum(len(q) for q in self.inbox.values())


async def verify_all(hosts: list, writes: list[Write], conns_per_node: int = 4) -> dict[str, list[str]]:
    """A GET of every answered write through every node: {node: [paths not live]} (None answers retried once)."""
    missing: dict[str, list[str]] = {h.name: [] for h in hosts}

    async def worker(host, chunk: list[Write]) -> None:
        conns = {t: Conn(host.address, TENANT_PORTS[t]) for t in range(len(TENANTS))}
        for w in chunk:
            answer = await conns[w.tenant].get(w.path, 2.0)
            if answer is None:
                answer = await conns[w.tenant].get(w.path, 3.0)
            if not is_live(answer, w.tenant):
                missing[host.name].append(f"{w.path}({TENANTS[w.tenant]}: {answer[0] if answer else 'no answer'})")
        for c in conns.values():
            c.close()

    jobs = [worker(h, writes[i::conns_per_node]) for h in hosts for i in range(conns_per_node)]
    await asyncio.gather(*jobs)
    return missing


# --- data-plane load ---------------------------------------------------------------------------------------------
class Load:
    """One wrk per node per phase (bounded: a Lua delay per request, 2 connections, stopped with SIGINT at the
    phase's end, and by itself after 15 min whatever happens to the bench)."""

    def __init__(self, hosts: list, base: Path) -> None:
        self.hosts = hosts
        self.script = base / "wrk-delay.lua"
        self.script.write_text(f"function delay()\n    return {WRK_DELAY_MS}\nend\n")
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self) -> None:
        for h in self.hosts:
            self.procs[h.name] = subprocess.Popen(
                ["wrk", "-t1", "-c2", "-d900s", "--timeout", "2s", "-s", str(self.script),
                 f"http://{h.address}:{EDGE_PORT}/"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def stop(self) -> dict[str, tuple[int, int]]:
        """{node: (requests, failed)}."""
        for p in self.procs.values():
            with contextlib.suppress(ProcessLookupError):
                p.send_signal(signal.SIGINT)
        out = {}
        for name, p in self.procs.items():
            try:
                text = p.communicate(timeout=15)[0]
            except subprocess.TimeoutExpired:
                p.kill()
                text = p.communicate()[0]
            requests = int(m.group(1)) if (m := _REQUESTS_RE.search(text)) else 0
            failed = sum(int(x) for x in m.groups()) if (m := _SOCKET_RE.search(text)) else 0
            failed += int(m.group(1)) if (m := _NON2XX_RE.search(text)) else 0
            out[name] = (requests, failed)
        self.procs = {}
        return out


# --- the database, read directly (the bench's own cluster) ---------------------------------------------------------
class Db:
    def __init__(self, port: int, name: str) -> None:
        self.kw = {"host": "127.0.0.1", "port": port, "user": "postgres", "dbname": name, "connect_timeout": 2}

    def query(self, sql: str, args: tuple = ()) -> list[tuple] | None:
        import psycopg

        try:
            with psycopg.connect(**self.kw) as conn:
                return conn.execute(sql, args).fetchall()
        except psycopg.Error:
            return None

    def fleet_state(self) -> dict[str, tuple[int, dict[str, int | None]]] | None:
        """{fleet: (desired_revision, {node: applied revision number})}."""
        rows = self.query(
            "SELECT f.name, f.desired_revision, n.name, r.number FROM fleets_fleet f "
            "JOIN fleets_node n ON n.fleet_id = f.id AND n.enabled "
            "LEFT JOIN fleets_configrevision r ON r.id = n.applied_revision_id")
        if rows is None:
            return None
        out: dict[str, tuple[int, dict[str, int | None]]] = {}
        for fleet, desired, node, applied in rows:
            out.setdefault(fleet, (desired, {}))[1][node] = applied
        return out


# --- phases --------------------------------------------------------------------------------------------------------
@dataclass
class Phase:
    name: str
    family: str  # baseline | kill | node | outage
    start: float = 0.0
    fault_start: float = 0.0
    fault_end: float = 0.0
    end: float = 0.0
    faulted_nodes: list[str] = field(default_factory=list)
    converge_s: float | None = None
    converge_note: str = ""
    wrk: dict[str, tuple[int, int]] = field(default_factory=dict)


class Chaos:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.base = Path(tempfile.mkdtemp(prefix="spw-chaos-", dir="/tmp"))
        self.base.chmod(0o755)
        self.keep = Path(f"/tmp/spillway-chaos-{os.getpid()}")
        self.pg: PgServer | None = None
        self.redis: RedisServer | None = None
        self.sup: Supervisor | None = None
        self.topo = None
        self.backends: subprocess.Popen | None = None
        self.load: Load | None = None
        self.writers: Writers | None = None
        self.prober: Prober | None = None
        self.phases: list[Phase] = []
        self.node_faults: list[tuple[str, float, float]] = []  # (node, from, to)
        self.findings: list[str] = []
        self.job_id: int | None = None
        self.job_created: datetime | None = None

    # --- setup ---------------------------------------------------------------------------------------------
    def setup(self) -> None:
        started = time.monotonic()
        self.pg = PgServer(self.base)
        self.pg.init()
        self.pg.start()
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.pg.port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:
            conn.execute('CREATE DATABASE "spillway"')
        self.redis = RedisServer(self.base)
        self.redis.start()
        logdir = self.base / "log"
        logdir.mkdir()
        env = dict(os.environ)
        env.update({
            "DATABASE_URL": self.pg.url("spillway"), "REDIS_URL": self.redis.url,
            "SECRET_KEY": "bench-only-secret-key", "FIELD_ENCRYPTION_KEY": "bench-only-field-key",
            "DJANGO_SETTINGS_MODULE": "controlplane.settings", "SPILLWAY_VAR_DIR": str(self.base / "var"),
            "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "INFO"),
            "SPILLWAY_MEMBER_NETWORKS": "127.0.0.0/8,10.215.0.0/16", "SPILLWAY_SIGNALS_TARGET": "",
        })
        for key in ("DEBUG", "SPILLWAY_TESTING", "CELERY_TASK_ALWAYS_EAGER"):
            env.pop(key, None)
        os.environ.update(env)
        import django

        django.setup()
        import logging

        logging.getLogger("asyncssh").setLevel(logging.WARNING)
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        tokens = self._bootstrap()
        self.db = Db(self.pg.port, "spillway")
        log(f"own PostgreSQL :{self.pg.port}, own Redis :{self.redis.port}, migrated "
            f"({time.monotonic() - started:.0f} s)")

        from tests import netns

        if why := netns.available():
            raise SystemExit(f"cannot run: {why}")
        self.topo = netns.Topology(prefix="s15c", subnet=40, count=6, base=self.base / "hosts")
        self.topo.up()
        self.hosts = self.topo.hosts
        bridge = f"{self.topo.network}.1"
        specs = [(name, bridge) for name in ("web-a", "web-b", "t1-a", "t1-b", "t2-a", "t2-b")]
        self.backends, ports = start_fast_backends(specs)
        log(f"6 hosts up in namespaces ({self.topo.network}.0/24), backends on {bridge} "
            f"({time.monotonic() - started:.0f} s)")

        self.web_ports = [pick_free_port(), pick_free_port()]
        self.sup = Supervisor(env, logdir)
        build_processes(self.sup, self.web_ports)
        for p in self.sup.procs:
            self.sup.start(p)
        self.sup.monitor.start()
        self._wait_web()
        self._wait_workers()
        log(f"{len(self.sup.procs)} Spillway processes up: " + ", ".join(
            f"{k} x{len(self.sup.of(k))}" for k in self.sup.kinds()) + f" ({time.monotonic() - started:.0f} s)")

        self.api = Api(self.web_ports, tokens["ops"])
        self._build(tokens, {name: port for (name, _), port in ports.items()})
        log(f"built through the API and rolled out to the 6 nodes over SSH ({time.monotonic() - started:.0f} s)")

    def _bootstrap(self) -> dict[str, str]:
        from apps.accounts.models import Organization, Role
        from apps.accounts.services import token_create, user_create_with_membership

        tokens = {}
        for slug, kind in (("ops", "operator"), *((t, "customer") for t in TENANTS)):
            org = Organization.objects.create(slug=slug, name=slug.upper(), kind=kind)
            user_create_with_membership(username=f"chaos-{slug}", password="chaos-password-123", org=org,
                                        role=Role.ADMIN)
            scopes = ["read", "write", "deploy"] if kind == "operator" else ["read", "write"]
            tokens[slug] = token_create(org=org, name="chaos", scopes=scopes).secret
        return tokens

    def _wait_web(self, timeout_s: float = 90.0) -> None:
        deadline = time.monotonic() + timeout_s
        for port in self.web_ports:
            while True:
                with contextlib.suppress(OSError):
                    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                    conn.request("GET", "/healthz")
                    if conn.getresponse().status == 200:
                        break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"web on :{port} did not answer /healthz within {timeout_s:.0f} s")
                time.sleep(0.2)

    def _wait_workers(self, timeout_s: float = 90.0) -> None:
        from controlplane.celery import app

        want = len([p for p in self.sup.procs if p.kind not in ("web", "beat", "enforcer")])
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if len(app.control.ping(timeout=1.0)) >= want:
                    return
            time.sleep(0.5)
        raise RuntimeError(f"{want} celery workers did not answer a ping within {timeout_s:.0f} s")

    def _build(self, tokens: dict[str, str], ports: dict[str, int]) -> None:
        api = self.api
        bridge = f"{self.topo.network}.1"
        for r in "ab":
            api.must("POST", "/api/v1/regions/", {"slug": r, "name": f"region {r}"})
        api.must("POST", "/api/v1/region-distances/", {"src": "a", "dst": "b", "rtt_ms": 30})
        api.must("POST", "/api/v1/region-distances/", {"src": "b", "dst": "a", "rtt_ms": 30})
        fleets = {r: api.must("POST", "/api/v1/fleets/", {"name": f"f{r}", "region": r})["id"] for r in "ab"}
        self.region_of = {}
        for i, host in enumerate(self.hosts):
            r = "a" if i < 3 else "b"
            self.region_of[host.name] = r
            api.must("POST", "/api/v1/nodes/", {"fleet": f"f{r}", "name": host.name,
                                                "ssh_private_key": self.topo.client_key, **self.topo.ssh_fields(host)})
        edge = api.must("POST", "/api/v1/load-balancers/", {"name": "edge", "fleet": fleets["a"]})["id"]
        # Region a: one member at 20 req/s; wrk offers ~60 req/s through each of a's nodes: a overflows to b.
        web = self.web_pool = api.must("POST", "/api/v1/pools/", {
            "lb": edge, "name": "web", "health_path": "",
            "regions": [{"region": "a", "max_rate_per_member": 20}, {"region": "b", "max_rate_per_member": 2000}]})
        for r in "ab":
            api.must("POST", "/api/v1/members/", {"pool": web["id"], "region": r, "name": f"web-{r}",
                                                  "address": bridge, "port": ports[f"web-{r}"]})
        api.must("POST", "/api/v1/listeners/", {"lb": edge, "name": "http", "port": EDGE_PORT,
                                                "default_pool": web["id"]})
        lbs = [edge]
        self.tenants = []
        for t, port in zip(TENANTS, TENANT_PORTS, strict=True):
            lb = api.must("POST", "/api/v1/load-balancers/", {"name": t, "org": t, "fleet": fleets["a"]})["id"]
            pool = api.must("POST", "/api/v1/pools/", {"lb": lb, "org": t, "name": "routes", "health_path": "",
                                                       "regions": [{"region": "a"}, {"region": "b"}]})
            for r in "ab":
                api.must("POST", "/api/v1/members/", {"pool": pool["id"], "region": r, "name": f"{t}-{r}",
                                                      "address": bridge, "port": ports[f"{t}-{r}"]})
            api.must("POST", "/api/v1/listeners/", {"lb": lb, "name": "http", "port": port, "no_route_status": 404})
            # The first route of a listener changes haproxy.cfg (a reload on every node, ~5 s over SSH on this
            # loaded machine); the writers measure route changes, which go through the runtime API.
            api.must("POST", "/api/v1/routes/", {"lb": lb, "path": "/seed", "path_match": "prefix", "priority": 50_000,
                                                 "targets": [{"pool": pool["id"], "weight": 100}]}, token=tokens[t])
            lbs.append(lb)
            self.tenants.append({"lb": lb, "pool": pool["id"], "token": tokens[t]})
        api.must("PATCH", f"/api/v1/fleets/{fleets['b']}/", {"serves": lbs})
        for lb in lbs:
            api.wait_applied(lb, 240)
        # The every-minute job (the cheapest kind: noop), a tenant's, through the API.
        job = api.must("POST", "/api/v1/jobs/", {"name": "tick", "kind": "noop", "schedule_type": "cron",
                                                 "cron": "* * * * *", "misfire_policy": "run_once"},
                       token=tokens["t1"])
        self.job_id = job["id"]
        self.job_created = datetime.now(UTC)

    # --- faults ---------------------------------------------------------------------------------------------------
    _LEADS = ("leads and sends the schedule", "enforcer: holding the lease", "takes the queue over")
    _STANDS_BY = ("this one stands by",)

    def _active(self, procs: list[Proc]) -> Proc | None:
        """The instance that holds its kind's lease now (beat leader, enforcer, fleet shard), from its log."""
        leading = []
        for p in procs:
            with contextlib.suppress(OSError):
                text = p.log.read_text(errors="replace").rsplit("===== chaos bench: start", 1)[-1]
                lead = max(text.rfind(x) for x in self._LEADS)
                if lead >= 0 and lead > max(text.rfind(x) for x in self._STANDS_BY):
                    leading.append(p)
        return leading[0] if len(leading) == 1 else None

    def kill(self, kind: str, which: str = "one", index: int = 0) -> None:
        procs = self.sup.of(kind)
        leader = self._active(procs) if which != "all" else None
        victims = procs if which == "all" else [leader or procs[index % len(procs)]]
        for p in victims:
            self.sup.kill9(p)
        log(f"  kill -9 {', '.join(p.name for p in victims)}{' (the lease holder)' if leader else ''}")
        time.sleep(RESTART_AFTER_S)
        for p in victims:
            self.sup.start(p)
        if kind == "web":
            self._wait_web()

    def pg_restart(self, down_s: float = 0.0) -> None:
        log(f"  PostgreSQL {'restart' if not down_s else f'down for {down_s:.0f} s'}")
        self.pg.stop("fast")
        time.sleep(down_s)
        self.pg.start()

    def redis_restart(self, down_s: float = 0.0) -> None:
        log(f"  Redis {'restart' if not down_s else f'down for {down_s:.0f} s'} (no persistence: its queues are lost)")
        self.redis.stop()
        time.sleep(down_s)
        self.redis.start()

    def node_cut(self, host, cut_s: float) -> None:
        t0 = time.monotonic()
        log(f"  {host.name}: link down for {cut_s:.0f} s")
        sh("ip", "link", "set", host.veth, "down")
        time.sleep(cut_s)
        sh("ip", "link", "set", host.veth, "up")
        self.node_faults.append((host.name, t0, time.monotonic()))

    def node_reboot(self, host, down_s: float = 3.0) -> None:
        t0 = time.monotonic()
        log(f"  {host.name}: reboot (every process killed, its namespace gone for {down_s:.0f} s)")
        self.topo.kill_host(host)
        time.sleep(down_s)
        self.topo.start_host(host)
        back = time.monotonic()
        while time.monotonic() - back < 30:
            with contextlib.suppress(OSError):
                conn = http.client.HTTPConnection(host.address, EDGE_PORT, timeout=1)
                conn.request("GET", "/")
                if conn.getresponse().status == 200:
                    break
            time.sleep(0.05)
        log(f"  {host.name}: up again, serving from its own files {time.monotonic() - back:.1f} s after its start")
        self.node_faults.append((host.name, t0, time.monotonic()))

    def cp_stop(self, minutes: float, reboot) -> None:
        log(f"  control plane stopped for {minutes:g} min ({len(self.sup.procs)} processes, SIGTERM)")
        t0 = time.monotonic()
        self.sup.stop_all()
        time.sleep(max(0.0, minutes * 30 - (time.monotonic() - t0)))
        self.node_reboot(reboot)
        time.sleep(max(0.0, minutes * 60 - (time.monotonic() - t0)))
        for p in self.sup.procs:
            self.sup.start(p)
        self._wait_web()
        log(f"  control plane back ({time.monotonic() - t0:.0f} s after the stop)")

    def together(self, *actions) -> None:
        threads = [threading.Thread(target=a) for a in actions]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    # --- measurement ---------------------------------------------------------------------------------------------
    def run_phase(self, name: str, family: str, action, observe_s: float, faulted: list[str] = ()) -> Phase:
        ph = Phase(name=name, family=family, faulted_nodes=list(faulted))
        ph.start = time.monotonic()
        self.load.start()
        time.sleep(3.0 if family != "baseline" else 0.0)
        ph.fault_start = time.monotonic()
        log(f"phase {name}")
        action()
        ph.fault_end = time.monotonic()
        self._converge(ph, timeout_s=max(observe_s, self.args.converge_timeout_s))
        rest = ph.fault_end + observe_s - time.monotonic()
        if rest > 0:
            time.sleep(rest)
        ph.wrk = self.load.stop()
        ph.end = time.monotonic()
        self.phases.append(ph)
        self._report(ph)
        crashed = [f"{n} (rc {rc})" for t, n, rc in self.sup.crashes if ph.start <= t < ph.end]
        if crashed:
            self.findings.append(f"phase {name}: processes exited on their own: {', '.join(crashed)}")
        return ph

    def _latest_answered(self, before: float) -> list[Write]:
        latest: dict[int, Write] = {}
        for w in list(self.writers.writes):
            if w.answered is not None and w.answered <= before and (
                    w.tenant not in latest or w.answered > latest[w.tenant].answered):
                latest[w.tenant] = w
        return list(latest.values())

    def _converge(self, ph: Phase, timeout_s: float) -> None:
        """Until every node applied its fleet's desired revision as of the fault's end (database) and the last
        write answered before it is live on every node (HTTP)."""
        want = None
        deadline = ph.fault_end + timeout_s
        while want is None and time.monotonic() < deadline:
            want = self.db.fleet_state()
            if want is None:
                time.sleep(0.25)
        latest = self._latest_answered(ph.fault_end)
        names = [h.name for h in self.hosts]
        last_state = None
        while time.monotonic() < deadline:
            state = self.db.fleet_state()
            db_ok = state is not None and want is not None and all(
                (applied or 0) >= want[f][0] for f, (_, nodes) in state.items() for applied in nodes.values())
            live_ok = all(all(n in w.confirm for n in names) for w in latest)
            last_state = state or last_state
            if db_ok and live_ok:
                ph.converge_s = time.monotonic() - ph.fault_end
                ph.converge_note = ", ".join(
                    f"{w.path} answered {ph.fault_end - w.answered:.1f} s before the fault's end, live everywhere "
                    f"{max(w.confirm.values()) - ph.fault_end:+.1f} s after it" for w in latest)
                return
            time.sleep(0.25)
        behind = []
        if want is not None and last_state is not None:
            for f, (desired, nodes) in last_state.items():
                behind += [f"{f}/{n} applied {a} < {want[f][0]} (desired now {desired})"
                           for n, a in nodes.items() if (a or 0) < want[f][0]]
        for w in latest:
            missing = [n for n in names if n not in w.confirm]
            if missing:
                behind.append(f"{w.path} ({TENANTS[w.tenant]}) not live on {missing}")
        ph.converge_note = "; ".join(behind) or "database unreachable"
        self.findings.append(f"phase {ph.name}: not converged {timeout_s:.0f} s after the fault: {ph.converge_note}")

    def _faulted(self, node: str, a: float, b: float) -> bool:
        return any(n == node and t0 <= b and t1 >= a for n, t0, t1 in self.node_faults)

    def write_delay(self, w: Write) -> float | None:
        if w.answered is None:
            return None
        delays = []
        for h in self.hosts:
            seen = w.confirm.get(h.name)
            if seen is None:
                if self._faulted(h.name, w.answered, time.monotonic()):
                    continue
                return None
            if not self._faulted(h.name, w.answered, seen):
                delays.append(seen - w.answered)
        return max(delays, default=None)

    def _phase_writes(self, ph: Phase) -> list[Write]:
        return [w for w in list(self.writers.writes) if w.answered is not None and ph.start <= w.answered < ph.end]

    def _report(self, ph: Phase) -> None:
        outside = sum(f for n, (_, f) in ph.wrk.items() if n not in ph.faulted_nodes)
        requests = sum(r for r, _ in ph.wrk.values())
        own = ", ".join(f"{n}: {ph.wrk.get(n, (0, 0))[1]} errors, {ph.wrk.get(n, (0, 0))[0]} answered"
                        for n in ph.faulted_nodes)
        api = self.writers.counts(ph.start, ph.end)
        writes = self._phase_writes(ph)
        delays = [d for d in (self.write_delay(w) for w in writes) if d is not None]
        pending = sum(1 for w in writes if self.write_delay(w) is None)
        conv = (f"{ph.converge_s:.1f} s ({ph.converge_note})" if ph.converge_s is not None
                else f"NOT converged ({ph.converge_note})")
        lat = sorted(w.latency for w in writes if w.latency is not None)
        api_lat = f"p50 {lat[len(lat) // 2]:.2f} s max {lat[-1]:.2f} s" if lat else "n/a"
        log(f"  => {ph.name}: dataplane {requests} answered, {outside} failed outside the faulted node"
            + (f" (faulted node's own: {own})" if own else "")
            + f"; api 2xx {api['2xx']} ({api_lat}) 500 {api['500']} 503 {api['503']} conn-errors {api['conn']} "
              f"gave-up {api['gave_up']}; change delay max "
            + (f"{max(delays):.2f} s p50 {sorted(delays)[len(delays) // 2]:.2f} s" if delays else "n/a")
            + (f" ({pending} not yet live)" if pending else "") + f"; converge {conv}; "
              f"loadavg {os.getloadavg()[0]:.1f}")
        if ph.faulted_nodes:
            # Does a faulted node hold its fleet-mates' changes? Delay per region, the faulted node left out.
            per_region = []
            for r in "ab":
                nodes = [n for n, reg in self.region_of.items() if reg == r and n not in ph.faulted_nodes]
                ds = sorted(max(w.confirm[n] for n in nodes) - w.answered for w in writes
                            if w.answered is not None and ph.fault_start <= w.answered < ph.fault_end
                            and all(n in w.confirm for n in nodes))
                if ds:
                    per_region.append(f"region {r} ({'/'.join(nodes)}): p50 {ds[len(ds) // 2]:.1f} s "
                                      f"max {ds[-1]:.1f} s")
            if per_region:
                log(f"     writes answered during the fault, live on the other nodes: {'; '.join(per_region)}")
        for detail in self.writers.details("gave_up", ph.start, ph.end)[:3]:
            log(f"     gave up: {detail}")
        for detail in self.writers.details("500", ph.start, ph.end)[:3]:
            log(f"     500: {detail}")
        bad503 = self.writers.details("503", ph.start, ph.end)
        for detail in bad503[:3]:
            log(f"     503 without Retry-After/JSON: {detail}")

    # --- the run --------------------------------------------------------------------------------------------------
    def schedule(self) -> list[tuple[str, str, object, float, list[str]]]:
        a = self.args
        h = {x.name: x for x in self.hosts}
        obs = a.observe_s
        out: list[tuple[str, str, object, float, list[str]]] = [("baseline", "baseline", lambda: None, obs, [])]
        if a.quick:
            out += [
                ("kill fleets-0 (one of two)", "kill", lambda: self.kill("fleets-0", index=0), obs, []),
                ("kill web (one of two)", "kill", lambda: self.kill("web", index=1), obs, []),
                ("postgres restart", "outage", lambda: self.pg_restart(), obs, []),
                ("redis restart", "outage", lambda: self.redis_restart(), obs, []),
                ("n2 cut off 10 s", "node", lambda: self.node_cut(h["n2"], 10), obs, ["n2"]),
                ("n5 reboot", "node", lambda: self.node_reboot(h["n5"]), obs, ["n5"]),
                (f"control plane stopped {a.cp_stop_min:g} min, n3 reboots", "outage",
                 lambda: self.cp_stop(a.cp_stop_min, h["n3"]), obs, ["n3"]),
                ("together: kill all web + all fleets-1 + postgres restart", "outage",
                 lambda: self.together(lambda: self.kill("web", "all"), lambda: self.kill("fleets-1", "all"),
                                       self.pg_restart), obs, []),
            ]
            return out
        for i, kind in enumerate(self.sup.kinds()):
            out.append((f"kill {kind} (one of {len(self.sup.of(kind))})", "kill",
                        lambda k=kind, j=i: self.kill(k, index=j), obs, []))
        out += [
            ("postgres restart", "outage", lambda: self.pg_restart(), obs, []),
            ("postgres down 30 s", "outage", lambda: self.pg_restart(30), obs, []),
            ("redis restart", "outage", lambda: self.redis_restart(), obs, []),
            ("redis down 30 s", "outage", lambda: self.redis_restart(30), obs, []),
            ("n2 cut off 20 s", "node", lambda: self.node_cut(h["n2"], 20), obs, ["n2"]),
            ("n5 reboot", "node", lambda: self.node_reboot(h["n5"]), obs, ["n5"]),
            (f"control plane stopped {a.cp_stop_min:g} min, n3 reboots", "outage",
             lambda: self.cp_stop(a.cp_stop_min, h["n3"]), obs, ["n3"]),
            ("together: kill all web + all worker + all fleets-0", "outage",
             lambda: self.together(lambda: self.kill("web", "all"), lambda: self.kill("worker", "all"),
                                   lambda: self.kill("fleets-0", "all")), obs, []),
            ("together: postgres restart + kill all beat + all enforcer", "outage",
             lambda: self.together(self.pg_restart, lambda: self.kill("beat", "all"),
                                   lambda: self.kill("enforcer", "all")), obs, []),
            ("together: redis restart + n6 reboot + kill all fleets-1", "outage",
             lambda: self.together(self.redis_restart, lambda: self.node_reboot(h["n6"]),
                                   lambda: self.kill("fleets-1", "all")), obs, ["n6"]),
        ]
        return out

    def run(self) -> int:
        started = time.monotonic()
        self.setup()
        self.load = Load(self.hosts, self.base)
        self.prober = Prober(self.hosts)
        self.writers = Writers(self.web_ports, self.tenants, self.args.rate, threads=16)
        self.writers.sinks.append(self.prober.add)
        self.prober.start()
        self.writers.start()
        log(f"writers at {self.args.rate:g}/min over {len(TENANTS)} tenants, wrk through all 6 nodes "
            f"(~{2 * 1000 // WRK_DELAY_MS} req/s each)")
        for name, family, action, observe_s, faulted in self.schedule():
            if family != "baseline" and self.args.only and self.args.only not in name:
                continue
            self.run_phase(name, family, action, observe_s, faulted)
        self.writers.stop()
        self.overflow()
        log(f"writers stopped: {sum(1 for w in self.writers.writes if w.outcome == '2xx')} writes answered 2xx, "
            f"{self.writers.dropped} skipped (behind by 30 s)")
        settle_end = time.monotonic() + 120
        answered = [w for w in self.writers.writes if w.outcome == "2xx"]
        names = [h.name for h in self.hosts]
        while time.monotonic() < settle_end and any(n not in w.confirm for w in answered for n in names):
            time.sleep(1.0)
        self.prober.stopping.set()
        self.prober.join(10)
        log(f"settled after {120 - max(0.0, settle_end - time.monotonic()):.0f} s; checking every write through "
            f"every node")
        missing = asyncio.run(verify_all(self.hosts, answered))
        self.dump_writes()
        # Wait for the job's last slot to have run (a minute boundary plus the dispatch and run).
        jobs = self.jobs()
        self.scan_logs()
        self.failed_node_results()
        return self.results(answered, missing, jobs, time.monotonic() - started)

    def jobs(self) -> dict:
        end = datetime.now(UTC) - timedelta(seconds=40)
        rows = self.db.query("SELECT scheduled_for, trigger, missed_since, status, attempt, attempts, error "
                             "FROM scheduling_jobrun WHERE job_id = %s ORDER BY scheduled_for", (self.job_id,)) or []
        first = (self.job_created + timedelta(minutes=1)).replace(second=0, microsecond=0)
        slots = []
        s = first
        while s <= end:
            slots.append(s)
            s += timedelta(minutes=1)
        cover = collections.Counter()
        dup_exec = 0
        failed = []
        for scheduled_for, trigger, missed_since, status, attempt, attempts, error in rows:
            if status == "skipped":
                continue
            lo = missed_since if (trigger == "catch_up" and missed_since) else scheduled_for
            covered = [x for x in slots if lo <= x <= scheduled_for]
            for x in covered:
                cover[x] += 1 if status == "succeeded" else 0
            if status != "succeeded":
                failed.append(f"{scheduled_for:%H:%M:%S} {trigger} {status} {error[:200]}")
            if attempt > 1 or len(attempts or []) > 1:  # `attempts` lists every execution, the last one too
                dup_exec += 1
        duplicate = sum(max(0, c - 1) for c in cover.values()) + dup_exec
        missed = [x for x in slots if cover[x] == 0]
        catch_ups = sum(1 for r in rows if r[1] == "catch_up")
        log(f"job: {len(slots)} slots {first:%H:%M}-{end:%H:%M} UTC, {len(rows)} runs ({catch_ups} catch-up), "
            f"duplicate {duplicate}, missed {len(missed)}"
            + (f" ({', '.join(f'{x:%H:%M}' for x in missed)})" if missed else ""))
        for line in failed[:5]:
            log(f"  run not succeeded: {line}")
        with (self.base / "log" / "jobruns.txt").open("w") as f:
            for row in rows:
                f.write(" | ".join(str(x) for x in row) + "\n")
        if duplicate or missed:
            for scheduled_for, trigger, missed_since, status, attempt, attempts, _ in rows:
                log(f"  run {scheduled_for:%H:%M:%S} {trigger} {status} attempt {attempt} "
                    f"missed_since {missed_since and f'{missed_since:%H:%M:%S}'} executions {len(attempts or [])}")
            self.findings.append(f"job runs: duplicate {duplicate}, missed {[f'{x:%H:%M}' for x in missed]}, "
                                 f"not succeeded {failed[:5]}")
        return {"duplicate": duplicate, "missed": len(missed)}

    def dump_writes(self) -> None:
        """Every write, for the evidence: times in seconds since the writers started."""
        t0 = self.writers.t0
        names = [h.name for h in self.hosts]
        with (self.base / "log" / "writes.csv").open("w") as f:
            f.write("k,tenant,path,sent,answered,latency,status,outcome,lb_revision,delay,"
                    + ",".join(f"live_{n}" for n in names) + ",history\n")
            for w in self.writers.writes:
                rel = [f"{w.confirm[n] - t0:.2f}" if n in w.confirm else "" for n in names]
                delay = self.write_delay(w)
                f.write(f"{w.k},{TENANTS[w.tenant]},{w.path},{w.sent - t0:.2f},"
                        f"{'' if w.answered is None else f'{w.answered - t0:.2f}'},"
                        f"{'' if w.latency is None else f'{w.latency:.3f}'},{w.status},{w.outcome},"
                        f"{w.revision or ''},{'' if delay is None else f'{delay:.2f}'},{','.join(rel)},"
                        f"{' '.join(w.history)}\n")
        with (self.base / "log" / "phases.txt").open("w") as f:
            for ph in self.phases:
                f.write(f"{ph.name}: start {ph.start - t0:.1f} fault {ph.fault_start - t0:.1f}-{ph.fault_end - t0:.1f} "
                        f"end {ph.end - t0:.1f} converge {ph.converge_s} ({ph.converge_note}) wrk {ph.wrk}\n")

    def phase_at(self, wall: datetime) -> str:
        mono = wall.timestamp() - (time.time() - time.monotonic())
        for ph in self.phases:
            if ph.start <= mono < ph.end:
                return ph.name
        return "between phases"

    def failed_node_results(self) -> None:
        """Rollouts' failed node results (the product's own record), by phase; unreachable ones only counted."""
        rows = self.db.query(
            "SELECT r.id, f.name, cr.number, n.name, nr.status, nr.unreachable, left(nr.error, 500), nr.finished_at "
            "FROM fleets_noderesult nr JOIN fleets_rollout r ON r.id = nr.rollout_id "
            "JOIN fleets_fleet f ON f.id = r.fleet_id JOIN fleets_configrevision cr ON cr.id = r.revision_id "
            "JOIN fleets_node n ON n.id = nr.node_id WHERE nr.status IN ('failed', 'rolled_back') "
            "ORDER BY nr.finished_at") or []
        unreachable = collections.Counter()
        for rid, fleet, number, node, status, unreach, error, finished in rows:
            where = self.phase_at(finished) if finished else "?"
            if unreach:
                unreachable[f"{node} in '{where}'"] += 1
                continue
            text = " ".join(error.split())
            log(f"rollout {rid} ({fleet} r{number}) {status} on {node} in phase '{where}': {text[:300]}")
            self.findings.append(f"rollout {rid} ({fleet} r{number}) {status} on {node} (reachable) in phase "
                                 f"'{where}' at {finished:%H:%M:%S}: {text[:300]}")
        if unreachable:
            log("node results failed as unreachable: " + ", ".join(f"{k}: {n}" for k, n in unreachable.items()))

    def overflow(self) -> None:
        """What the product observed of the capacity-limited pool (is it in overflow?), over the last 5 min."""
        try:
            view = self.api.must("GET", f"/api/v1/traffic/overflow/?pool={self.web_pool['id']}&window=5m")
        except (OSError, RuntimeError) as exc:
            log(f"overflow view unavailable: {exc}")
            return
        log("pool web over the last 5 min (req/s, the product's view): " + "; ".join(
            f"{r['region']}: capacity {r['capacity']} demand {r['demand']} local {r['local']} out {r['out']} "
            f"in {r['in']}" for r in view.get("regions", [])))

    def scan_logs(self) -> None:
        """ERROR/CRITICAL lines and tracebacks per process log, grouped by message (numbers masked)."""
        ssh = collections.Counter()
        for path in sorted((self.base / "log").glob("*.log")):
            with path.open(errors="replace") as f:
                ssh[path.stem.rsplit("-", 1)[0]] = sum(1 for line in f if "Opening SSH connection" in line)
        took = max(1.0, time.monotonic() - self.writers.t0)
        log("SSH connections opened to the nodes: " + ", ".join(
            f"{k} {n} ({n / took:.1f}/s)" for k, n in ssh.most_common() if n))
        for path in sorted((self.base / "log").glob("*.log")):
            groups: collections.Counter = collections.Counter()
            first: dict[str, str] = {}
            with path.open(errors="replace") as f:
                for line in f:
                    if " ERROR" not in line and "CRITICAL" not in line and "rollout.failed [operator]" not in line:
                        continue
                    msg = line.split("] ", 1)[-1].strip()
                    key = re.sub(r"[0-9a-f]{8}-[0-9a-f-]{27}|\d+", "N", msg)[:160]
                    groups[key] += 1
                    first.setdefault(key, line.strip()[:400])
            if groups:
                log(f"{path.name}: " + "; ".join(f"{n}x {first[k]}" for k, n in groups.most_common(4)))

    def results(self, answered: list[Write], missing: dict[str, list[str]], jobs: dict, took: float) -> int:
        lost = sorted({p for paths in missing.values() for p in paths})
        for node, paths in missing.items():
            if paths:
                log(f"NOT live on {node}: {len(paths)} writes, e.g. {paths[:8]}")
                self.findings.append(f"lost changes on {node}: {len(paths)} (e.g. {paths[:5]})")
        dataplane = sum(f for ph in self.phases for n, (_, f) in ph.wrk.items() if n not in ph.faulted_nodes)
        own = sum(f for ph in self.phases for n, (_, f) in ph.wrk.items() if n in ph.faulted_nodes)
        counts = self.writers.counts(0, float("inf"))
        bad503 = self.writers.details("503")
        converge = [ph.converge_s if ph.converge_s is not None else float("inf") for ph in self.phases
                    if ph.family != "baseline"]
        by_family: dict[str, list[float]] = collections.defaultdict(list)
        for ph in self.phases:
            for w in self._phase_writes(ph):
                d = self.write_delay(w)
                by_family[ph.family].append(d if d is not None else float("inf"))
        kill_delays = by_family["baseline"] + by_family["kill"]
        figures = {
            "dataplane_errors": dataplane, "lost_changes": len(lost), "api_500": counts["500"],
            "api_503": counts["503"], "converge_s_max": max(converge, default=0.0),
            "jobs_duplicate": jobs["duplicate"], "jobs_missed": jobs["missed"],
            "change_delay_s_max": max(kill_delays, default=0.0),
        }
        if counts["500"]:
            self.findings.append(f"{counts['500']} answers 500, e.g. {self.writers.details('500')[:3]}")
        if bad503:
            self.findings.append(f"{len(bad503)} answers 503 without Retry-After or a JSON body, e.g. {bad503[:2]}")
        log(f"took {took / 60:.1f} min; {len(answered)} writes answered 2xx, {counts['gave_up']} gave up after 60 s "
            f"of retries, {sum(1 for w in self.writers.writes if w.outcome.startswith('refused'))} refused; "
            f"faulted nodes' own dataplane errors {own}; 503s without Retry-After/JSON {len(bad503)}")
        for family in ("baseline", "kill", "node", "outage"):
            values = by_family[family]
            if values:
                finite = sorted(v for v in values if v != float("inf"))
                log(f"change delay in {family} phases: {len(values)} writes, max "
                    f"{max(values):.2f} s, p50 {finite[len(finite) // 2] if finite else float('nan'):.2f} s")
        if self.findings:
            log("findings:")
            for f in self.findings:
                print(f"  - {f}", flush=True)
        missed = [k for k, goal in GOALS.items() if figures[k] > goal]
        print(f"Goals: {' '.join(f'{k}<={v}' for k, v in GOALS.items())}; missed: {', '.join(missed) or 'none'}")
        fmt = {k: (f"{v:.2f}" if isinstance(v, float) else str(v)) for k, v in figures.items()}
        print(f"RESULT dataplane_errors={fmt['dataplane_errors']} lost_changes={fmt['lost_changes']} "
              f"api_500={fmt['api_500']} api_503={fmt['api_503']} converge_s_max={fmt['converge_s_max']} "
              f"jobs_duplicate={fmt['jobs_duplicate']} jobs_missed={fmt['jobs_missed']} "
              f"change_delay_s_max={fmt['change_delay_s_max']} "
              f"change_delay_node_s_max={max(by_family['node'], default=0.0):.2f} "
              f"change_delay_outage_s_max={max(by_family['outage'], default=0.0):.2f}", flush=True)
        return 1 if missed else 0

    def close(self) -> None:
        for step in (lambda: self.writers and self.writers.stopping.set(),
                     lambda: self.prober and self.prober.stopping.set(),
                     lambda: self.load and self.load.procs and self.load.stop(),
                     lambda: self.sup and self.sup.stopping.set(),
                     lambda: self.sup and self.sup.stop_all(),
                     lambda: self.topo and self.topo.down(),
                     lambda: self.backends and (self.backends.kill(), self.backends.wait(5)),
                     lambda: self.redis and self.redis.stop(),
                     lambda: self.pg and self.pg.stop("fast")):
            try:
                step()
            except Exception as exc:  # every step runs, whatever failed before it
                print(f"cleanup: {exc!r}", file=sys.stderr)
        with contextlib.suppress(OSError):
            self.keep.mkdir(exist_ok=True)
            for path in [*(self.base / "log").glob("*.*"), self.base / "postgres.log", self.base / "redis.log"]:
                if path.exists():
                    shutil.copy(path, self.keep / path.name)
            print(f"logs kept in {self.keep}", flush=True)
        shutil.rmtree(self.base, ignore_errors=True)


def _interrupt(*_: object) -> None:
    raise KeyboardInterrupt


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one fault of each family, short outages (<= 8 min)")
    parser.add_argument("--only", default="", help="run the baseline and the phases whose name holds this text")
    parser.add_argument("--cp-stop-min", type=float, default=None, help="control plane stop (default 5; quick 1)")
    parser.add_argument("--rate", type=float, default=1000.0, help="route writes per minute, both tenants")
    parser.add_argument("--observe-s", type=float, default=None, help="seconds after each fault (20; quick 15)")
    parser.add_argument("--converge-timeout-s", type=float, default=90.0)
    args = parser.parse_args()
    if args.cp_stop_min is None:
        args.cp_stop_min = 1.0 if args.quick else 5.0
    if args.observe_s is None:
        args.observe_s = 15.0 if args.quick else 20.0
    if os.geteuid() != 0:
        raise SystemExit("cannot run: network namespaces and the own PostgreSQL (runuser) need root")
    # SIGTERM (a CI timeout) stops everything like Ctrl-C does: the finally below runs.
    signal.signal(signal.SIGTERM, _interrupt)
    chaos = Chaos(args)
    try:
        return chaos.run()
    finally:
        chaos.close()


if __name__ == "__main__":
    sys.exit(main())
