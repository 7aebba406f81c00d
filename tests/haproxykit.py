"""Real-process fixtures and helpers: HAProxy nodes, tiny HTTP backends, an sshd (fleets, traffic, acme, frontend,
signals tests use them).

The fixtures are a plugin of the whole suite (tests/conftest.py `pytest_plugins`): a test asks for `haproxy_node`,
`tiny_backend`, `haproxy_bin`, `free_port`, `sshd` or `demo_fleet_addresses` by name and imports nothing; the
helpers (HAProxyNodeFactory, TinyBackend, SimpleBundle, standard_global, pool_config, ...) are imported from here.

Everything listens on 127.0.0.0/8 only, on ports the kernel hands out, and every
process is stopped by its PID at teardown, also when the test fails.

Usage::

    def test_it_serves(haproxy_node, tiny_backend, free_port):
        backend = tiny_backend("b1")
        port = free_port()
        node, proc = haproxy_node(f'''
    frontend fe
        bind 127.0.0.1:{port}
        default_backend be
    backend be
        server b1 {backend.address}:{backend.port}
    ''')
        assert http_get(f"http://127.0.0.1:{port}/") == (200, "b1")

``haproxy_node(body)`` prepends ``standard_global(node)`` (stats socket, server-state
file, ``default-path config``, short timeouts) to ``body``; pass a callable
``(NodeConn) -> str`` instead for full control. The config is installed with
``LocalTransport.push`` (the same layout production nodes use) and the master is
started with ``apps.fleets.node.process.start_master``.
"""

from __future__ import annotations

import getpass
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from apps.fleets.config.digest import set_digest
from apps.fleets.node.process import start_master, stop_master
from apps.fleets.node.transports.base import NodeConn
from apps.fleets.node.transports.local import LocalTransport
from tests import deps
from tests.netutil import pick_free_port
from tests.processes import stop_process

HAPROXY_BIN = shutil.which("haproxy") or "/usr/sbin/haproxy"
SSHD_BIN = "/usr/sbin/sshd"


DEMO_FLEET_LOCK = "/tmp/spillway-demo-fleet.lock"


@pytest.fixture
def demo_fleet_addresses() -> Iterator[None]:
    """Hold the demo fleet's fixed addresses (127.0.40.x, 127.0.41.x, the demo backends) for one test.

    A file lock, not a port check alone: two xdist workers, or two checkouts' suites on one machine, would
    both find them free and then both start. A `make run` (which takes no lock) holding them skips the test.
    """
    import fcntl

    from apps.fleets.demo import demo_addresses

    with open(DEMO_FLEET_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        busy = [f"{a}:{p}" for a, p in demo_addresses() if not _port_is_free(a, p, reuse=True)]
        if busy:
            pytest.skip(f"a demo fleet is already running on this machine (make run): {', '.join(busy)}")
        yield


def _port_is_free(address: str, port: int, *, reuse: bool = False) -> bool:
    with socket.socket() as probe:
        if reuse:  # TIME_WAIT leftovers of a stopped node do not count
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def pool_config(port: int, *backends: TinyBackend) -> str:
    """A frontend on 127.0.0.1:port balancing over the given tiny backends."""
    servers = "\n".join(f"    server {b.name} {b.server_line_addr} weight 10" for b in backends)
    return f"""
frontend fe
    bind 127.0.0.1:{port}
    default_backend pool

backend pool
    balance roundrobin
{servers}
"""


def standard_global(node: NodeConn) -> str:
    """The global/defaults every Spillway node config needs for runtime API and reloads."""
    return f"""global
    default-path config
    stats socket {node.stats_socket_path} mode 600 level admin
    server-state-file {node.server_state_path}
    hard-stop-after 5s

defaults
    mode http
    timeout connect 1s
    timeout client 5s
    timeout server 5s
    option idle-close-on-response
    load-server-state-from-file global
"""


@dataclass(frozen=True)
class SimpleBundle:
    """Stands in for apps.fleets.config.spec.ConfigBundle until that exists."""

    files: dict[str, bytes]
    sha256: str = ""

    @classmethod
    def of(cls, files: dict[str, bytes]) -> SimpleBundle:
        return cls(files, set_digest(files))


ConfigArg = str | Callable[[NodeConn], str]


def render_config(node: NodeConn, config: ConfigArg) -> str:
    return config(node) if callable(config) else standard_global(node) + config


@pytest.fixture
def free_port() -> Callable[..., int]:
    """``free_port(address="127.0.0.1") -> int``."""
    return pick_free_port


@pytest.fixture
def haproxy_bin() -> str:
    if not os.path.exists(HAPROXY_BIN):
        deps.missing("haproxy is not installed (apt-get install haproxy)")
    return HAPROXY_BIN


class HAProxyNodeFactory:
    """``factory(config, *, name=None, address="127.0.0.1", files=None) -> (NodeConn, Popen)``."""

    def __init__(self, base: Path, haproxy_bin: str) -> None:
        self.base = base
        self.haproxy_bin = haproxy_bin
        self.started: list[subprocess.Popen[bytes]] = []
        self._count = 0
        # HAProxy caps unix socket paths at 97 bytes and pytest's tmp_path (more so
        # under xdist) can be longer, so sockets live in a short dir of their own.
        self.runtime_base = Path(tempfile.mkdtemp(prefix="spw-"))

    def conn(self, name: str, address: str = "127.0.0.1") -> NodeConn:
        return NodeConn(
            name=name,
            address=address,
            runtime_dir=str(self.runtime_base / name),
            config_dir=str(self.base / name / "etc"),
            haproxy_bin=self.haproxy_bin,
        )

    def __call__(
        self,
        config: ConfigArg,
        *,
        name: str | None = None,
        address: str = "127.0.0.1",
        files: dict[str, bytes] | None = None,
    ) -> tuple[NodeConn, subprocess.Popen[bytes]]:
        self._count += 1
        node = self.conn(name or f"node{self._count}", address)
        bundle = SimpleBundle.of({"haproxy.cfg": render_config(node, config).encode(), **(files or {})})
        pushed = LocalTransport(node).push(bundle)
        if not pushed.ok:
            raise AssertionError(f"initial config of {node.name} is invalid:\n{pushed.validation_output}")
        proc = start_master(node.config_path, node.runtime_dir, self.haproxy_bin)
        self.started.append(proc)
        return node, proc

    def stop_all(self) -> None:
        for proc in reversed(self.started):
            stop_master(proc, soft_timeout_s=1.0, term_timeout_s=1.0)
        shutil.rmtree(self.runtime_base, ignore_errors=True)


@pytest.fixture
def haproxy_node(tmp_path: Path, haproxy_bin: str) -> Iterator[HAProxyNodeFactory]:
    """Factory starting real HAProxy masters; all stopped by PID at teardown."""
    factory = HAProxyNodeFactory(tmp_path / "nodes", haproxy_bin)
    try:
        yield factory
    finally:
        factory.stop_all()


@dataclass
class TinyBackend:
    name: str
    address: str
    port: int
    hits: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def count(self) -> None:
        with self._lock:
            self.hits += 1

    @property
    def server_line_addr(self) -> str:
        return f"{self.address}:{self.port}"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    backend: TinyBackend

    def handle_error(self, request: object, client_address: object) -> None:
        # HAProxy closes idle server-side connections (reloads, drains) with a reset;
        # that is normal here and must not spray tracebacks over test output.
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Head and body in one write, and TCP_NODELAY: written apart, the body waited for HAProxy's delayed ACK of
    # the head, ~40 ms a request, which capped paced tests far below their offered rate.
    disable_nagle_algorithm = True
    server: _Server

    def do_GET(self) -> None:
        backend = self.server.backend
        backend.count()
        if self.path.startswith("/slow/"):  # /slow/<ms>: a request that takes a while (one still open, say)
            time.sleep(int(self.path.split("/")[2]) / 1000)
        body = backend.name.encode()
        head = f"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
        self.wfile.write(head.encode() + body)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def tiny_backend() -> Iterator[Callable[..., TinyBackend]]:
    """``tiny_backend(name, address="127.0.0.1", port=None) -> TinyBackend``: a threaded HTTP
    server answering 200 with its own name and counting requests in ``.hits``."""
    servers: list[_Server] = []

    def start(name: str, address: str = "127.0.0.1", port: int | None = None) -> TinyBackend:
        server = _Server((address, port or 0), _Handler)
        backend = TinyBackend(name, address, int(server.server_address[1]))
        server.backend = backend
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        servers.append(server)
        return backend

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


@dataclass(frozen=True)
class SshdInfo:
    host: str
    port: int
    user: str
    client_key: str  # OpenSSH PEM of a key listed in authorized_keys
    known_hosts: str  # "[127.0.0.1]:<port> ssh-ed25519 AAAA..."
    host_public_key: str  # "ssh-ed25519 AAAA..."
    pid: int

    def node(self, base: NodeConn) -> NodeConn:
        """``base`` (runtime/config dirs of a local node) reached through this sshd."""
        return NodeConn(
            name=base.name,
            address=base.address,
            runtime_dir=base.runtime_dir,
            config_dir=base.config_dir,
            haproxy_bin=base.haproxy_bin,
            transport="ssh",
            ssh_host=self.host,
            ssh_port=self.port,
            ssh_user=self.user,
            ssh_private_key=self.client_key,
            ssh_known_hosts=self.known_hosts,
        )


def _keygen(path: Path) -> tuple[str, str]:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "spillway-test", "-f", str(path)],
        check=True,
        stdin=subprocess.DEVNULL,
        capture_output=True,
    )
    return path.read_text(), path.with_suffix(".pub").read_text().strip()


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshdInfo]:
    """A real OpenSSH sshd on 127.0.0.1 with a fresh host key and one authorized client key.

    Runs as the current user (root here), with its own config, PidFile and keys in
    tmp_path; SFTP, TCP and streamlocal forwarding enabled as OpenSSH's defaults do.
    """
    if not os.path.exists(SSHD_BIN) or not shutil.which("ssh-keygen"):
        deps.missing(f"{SSHD_BIN} or ssh-keygen (apt-get install openssh-server)")
    root = tmp_path / "sshd"
    root.mkdir()
    _host_priv, host_pub = _keygen(root / "host_ed25519")
    client_priv, client_pub = _keygen(root / "client_ed25519")
    (root / "authorized_keys").write_text(client_pub + "\n")
    # sshd refuses to start without its privilege separation directory.
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    port = pick_free_port()
    config = root / "sshd_config"
    config.write_text(
        f"""Port {port}
ListenAddress 127.0.0.1
HostKey {root / "host_ed25519"}
PidFile {root / "sshd.pid"}
AuthorizedKeysFile {root / "authorized_keys"}
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding yes
AllowStreamLocalForwarding yes
Subsystem sftp internal-sftp
LogLevel ERROR
"""
    )
    log = (root / "sshd.log").open("ab")
    proc = subprocess.Popen(
        [SSHD_BIN, "-D", "-e", "-f", str(config), "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    log.close()
    try:
        deadline = time.monotonic() + 10.0
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"sshd exited with {proc.returncode}: {(root / 'sshd.log').read_text()}")
            if not _port_is_free("127.0.0.1", port):
                try:
                    with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
                        if sock.recv(64).startswith(b"SSH-"):
                            break
                except OSError:
                    pass
            if time.monotonic() > deadline:
                raise AssertionError(f"sshd did not listen on {port}: {(root / 'sshd.log').read_text()}")
            time.sleep(0.02)
        yield SshdInfo(
            host="127.0.0.1",
            port=port,
            user=getpass.getuser(),
            client_key=client_priv,
            known_hosts=f"[127.0.0.1]:{port} {host_pub}",
            host_public_key=host_pub,
            pid=proc.pid,
        )
    finally:
        # sshd forks one child per connection into its own session; the listener is our PID.
        stop_process(proc, timeout_s=5.0)
