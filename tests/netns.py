"""Real "hosts" on this machine: Linux network namespaces joined by a bridge (needs root).

Each host is a namespace with one veth into the bridge (its `eth0`), an address in a private /24 that
exists only on this bridge, and its own sshd, HAProxy master (apps.fleets.node.process), keepalived (started
outside, moved in by `net_namespace`: see start_keepalived) and a tiny HTTP backend (a plain HAProxy) on
its own loopback answering with the host's name. Spillway reaches the hosts through the SSH transport
like any remote node. Every process is stopped by its PID and every namespace, veth and the bridge are
removed by `down()`.

Several runs may build topologies at once (the lead's whole suite, an engineer's targeted run of the same
test module, a benchmark): each Topology claims a free *slot* by an exclusive lock on a file, and its
names (prefix + slot: s15t0n1, s15t0br, ...) and its /24 (10.215.<subnet + slot>) belong to that slot only.
A slot whose lock is free belongs to nobody alive, so what is left under its names (a run that died) is
cleared by `up()` without touching another live run's hosts.

    topo = Topology(prefix="s15t", subnet=10, count=3, base=Path("/tmp/..."))
    topo.up()          # namespaces, bridge, sshd + backend + HAProxy + keepalived on each host
    ...
    topo.down()
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from apps.fleets.config.spec import ConfigBundle
from apps.fleets.node.process import start_master
from apps.fleets.node.transports.base import KEEPALIVED_NAME, KEEPALIVED_PID_NAME, NodeConn
from apps.fleets.node.transports.local import LocalTransport
from tests.waiting import wait_for

HAPROXY_BIN = shutil.which("haproxy") or "/usr/sbin/haproxy"
KEEPALIVED_BIN = shutil.which("keepalived") or "/usr/sbin/keepalived"
SSHD_BIN = "/usr/sbin/sshd"
BACKEND_PORT = 9000
IFACE = "eth0"
# Slots per prefix: topologies of one prefix alive at once. Interface names must fit 15 characters and
# the HAProxy link's comm ("haproxy-s15t0n1") too, hence one digit.
SLOTS = 8
LOCK_DIR = Path("/tmp")


def available() -> str | None:
    """None when namespaces can be used here, else why not."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for binary in (HAPROXY_BIN, KEEPALIVED_BIN, SSHD_BIN, shutil.which("ip") or "/nonexistent"):
        if not os.path.exists(binary):
            return f"{binary} is missing"
    return None


def sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=check)


def _stop(proc: subprocess.Popen | None) -> None:
    """SIGKILL the process group we created (start_new_session) for `proc`, then reap it."""
    if proc is None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(5.0)


@dataclass
class Host:
    name: str  # node name (n1...)
    netns: str
    veth: str  # root-side end, in the bridge
    address: str
    dir: Path
    host_key_pub: str = ""
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def runtime_dir(self) -> str:
        return str(self.dir / "run")

    @property
    def config_dir(self) -> str:
        return str(self.dir / "etc")

    @property
    def haproxy_bin(self) -> str:
        """This host's HAProxy: a link to the real binary named after the namespace, so its processes
        carry their own name (comm) although every host shares this machine's process table; keepalived's
        track_process follows that name (render/keepalived.py), as it follows "haproxy" on a real host."""
        return str(self.dir / f"haproxy-{self.netns}")

    def local_conn(self) -> NodeConn:
        return NodeConn(name=self.name, address=self.address, runtime_dir=self.runtime_dir,
                        config_dir=self.config_dir, haproxy_bin=self.haproxy_bin)


def claim_slot(prefix: str) -> tuple[int, int]:
    """The first slot of `prefix` no live process holds: (slot, fd of its lock file, held until closed).

    flock is released by the kernel when its holder dies, so a crashed run never keeps a slot."""
    for slot in range(SLOTS):
        fd = os.open(LOCK_DIR / f"spillway-netns-{prefix}{slot}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        return slot, fd
    raise RuntimeError(f"all {SLOTS} network-namespace slots of {prefix!r} are in use")


class Topology:
    def __init__(self, *, prefix: str, subnet: int, count: int, base: Path) -> None:
        assert prefix.startswith("s15") and len(prefix) <= 4 and 1 <= subnet <= 254 - SLOTS
        self.slot, self._lock_fd = claim_slot(prefix)
        self.prefix = prefix = f"{prefix}{self.slot}"
        self.bridge = f"{prefix}br"
        self.network = f"10.215.{subnet + self.slot}"
        self.base = base
        self.hosts = [
            Host(name=f"n{i}", netns=f"{prefix}n{i}", veth=f"{prefix}v{i}", address=f"{self.network}.{10 + i}",
                 dir=base / f"n{i}")
            for i in range(1, count + 1)
        ]
        self.client_key = ""

    def vip(self, i: int) -> str:
        return f"{self.network}.{100 + i}"

    # --- lifecycle ------------------------------------------------------------------------------
    def up(self) -> None:
        self._clear()  # leftovers of a run that died holding this slot
        self.base.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        sh("ip", "link", "add", self.bridge, "type", "bridge")
        sh("ip", "addr", "add", f"{self.network}.1/24", "dev", self.bridge)
        sh("ip", "link", "set", self.bridge, "up")
        keydir = self.base / "keys"
        keydir.mkdir(exist_ok=True)
        sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "spillway-test", "-f", str(keydir / "client"))
        self.client_key = (keydir / "client").read_text()
        (keydir / "authorized_keys").write_text((keydir / "client.pub").read_text())
        for host in self.hosts:
            host.dir.mkdir(parents=True, exist_ok=True)
            Path(host.haproxy_bin).unlink(missing_ok=True)
            Path(host.haproxy_bin).symlink_to(HAPROXY_BIN)
            sh("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host.dir / "host_key"))
            host.host_key_pub = " ".join((host.dir / "host_key.pub").read_text().split()[:2])
            self._bootstrap_config(host)
            self.start_host(host)

    def down(self) -> None:
        """Everything `up()` made is gone; the slot is free again."""
        try:
            self._clear()
        finally:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1

    def namespace_ids(self) -> set[int]:
        """Each live host namespace's inode (as /proc/<pid>/ns/net names it), to look for what outlives down()."""
        return {os.stat(f"/run/netns/{h.netns}").st_ino for h in self.hosts if os.path.exists(f"/run/netns/{h.netns}")}

    def _clear(self) -> None:
        assert self._lock_fd >= 0, "this topology's slot was released by down()"
        for host in self.hosts:
            self._kill_processes(host)
            sh("ip", "netns", "del", host.netns, check=False)
            sh("ip", "link", "del", host.veth, check=False)
        sh("ip", "link", "del", self.bridge, check=False)

    def start_host(self, host: Host) -> None:
        """Namespace + veth + sshd + backend + HAProxy (current config) + keepalived."""
        sh("ip", "link", "del", host.veth, check=False)  # a veth of a namespace whose teardown still runs
        sh("ip", "netns", "add", host.netns)
        # A fixed MAC per host, as a rebooted machine keeps its NIC's: peers' ARP caches stay right.
        mac = f"02:15:00:00:{int(self.network.rsplit('.', 1)[1]):02x}:{int(host.address.rsplit('.', 1)[1]):02x}"
        sh("ip", "link", "add", host.veth, "type", "veth", "peer", "name", f"{host.veth}p", "address", mac,
           "netns", host.netns)
        sh("ip", "link", "set", host.veth, "master", self.bridge, "up")
        ns = ("ip", "-n", host.netns)
        sh(*ns, "link", "set", f"{host.veth}p", "name", IFACE)
        sh(*ns, "addr", "add", f"{host.address}/24", "dev", IFACE)
        sh(*ns, "link", "set", IFACE, "up")
        sh(*ns, "link", "set", "lo", "up")
        self._start_sshd(host)
        self._start_backend(host)
        self.start_haproxy(host)
        self.start_keepalived(host)

    def kill_haproxy(self, host: Host) -> None:
        _stop(host.procs.pop("haproxy", None))

    def kill_host(self, host: Host) -> None:
        """The whole host goes away at once: its cable is cut first (veth deleted, so not one more packet,
        not even a last VRRP advert from a keepalived that saw its HAProxy die, leaves it), then every
        process is killed and its namespace deleted."""
        sh("ip", "link", "del", host.veth, check=False)
        self._kill_processes(host)
        sh("ip", "netns", "del", host.netns, check=False)

    # --- pieces -------------------------------------------------------------------------------------
    def _popen(self, host: Host, name: str, argv: list[str]) -> subprocess.Popen:
        log = (host.dir / f"{name}.log").open("ab")
        try:
            proc = subprocess.Popen(["ip", "netns", "exec", host.netns, *argv], stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        host.procs[name] = proc
        return proc

    def _kill_processes(self, host: Host) -> None:
        for name in list(host.procs):
            _stop(host.procs.pop(name))
        # What those started inside the namespace and outlived them: sshd's sessions (one per SSH connection a
        # test's control plane held) stayed forever once the veth was gone, their client's FIN never arriving:
        # 3 sshd + 3 sftp processes left behind by every `make test`.
        def left() -> list[int]:
            found = subprocess.run(["ip", "netns", "pids", host.netns], capture_output=True, text=True, check=False)
            return [int(pid) for pid in found.stdout.split()]

        for pid in left():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        # A killed process is in the namespace until it has exited, which takes a moment on a busy machine (a full
        # run at six workers once found an sshd session there right after down(), gone a second later).
        wait_for(lambda: not left(), 5.0)

    def _bootstrap_config(self, host: Host) -> None:
        """What a freshly installed node has before Spillway's first push: an empty HAProxy config and a
        keepalived.conf with no instance (both started by the host's own supervisor, here this class)."""
        conn = host.local_conn()
        cfg = (f"global\n    default-path config\n    stats socket {conn.stats_socket_path} mode 600 level admin\n"
               f"    server-state-file {conn.server_state_path}\n    hard-stop-after 5s\n\n"
               "defaults\n    mode http\n    timeout connect 1s\n    timeout client 5s\n    timeout server 5s\n")
        bundle = ConfigBundle.of({"haproxy.cfg": cfg.encode(),
                                  KEEPALIVED_NAME: f"global_defs {{\n    router_id {host.name}\n}}\n".encode()})
        # Validates with haproxy -c and keepalived -t here; the VRRP interface is not named yet.
        result = LocalTransport(conn).push(bundle)
        assert result.ok, result.validation_output

    def _start_sshd(self, host: Host) -> None:
        keydir = self.base / "keys"
        config = host.dir / "sshd_config"
        config.write_text(
            f"Port 22\nListenAddress {host.address}\nHostKey {host.dir / 'host_key'}\n"
            f"PidFile {host.dir / 'sshd.pid'}\nAuthorizedKeysFile {keydir / 'authorized_keys'}\nUsePAM no\n"
            "StrictModes no\nPermitRootLogin prohibit-password\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nAllowTcpForwarding yes\nAllowStreamLocalForwarding yes\n"
            "Subsystem sftp internal-sftp\nLogLevel ERROR\n")
        self._popen(host, "sshd", [SSHD_BIN, "-D", "-e", "-f", str(config)])
        self._wait_tcp(host, host.address, 22, b"SSH-")

    def _start_backend(self, host: Host) -> None:
        """A second, plain HAProxy on the host's loopback that answers with the host's name: fast enough
        that a benchmark measures failover, not a slow backend."""
        config = host.dir / "backend.cfg"
        config.write_text(
            "defaults\n    mode http\n    timeout client 5s\n    timeout server 5s\n    timeout connect 1s\n"
            f"frontend backend\n    bind 127.0.0.1:{BACKEND_PORT}\n"
            f'    http-request return status 200 content-type text/plain string "{host.name}"\n')
        self._popen(host, "backend", [HAPROXY_BIN, "-db", "-f", str(config)])

    def start_haproxy(self, host: Host) -> None:
        conn = host.local_conn()
        wrapper = host.dir / "haproxy-in-netns"
        # The master re-executes argv[0] (this host's link to the binary) on reload, already inside the namespace.
        wrapper.write_text(f"#!/bin/sh\nexec ip netns exec {host.netns} {host.haproxy_bin} \"$@\"\n")
        wrapper.chmod(0o755)
        host.procs["haproxy"] = start_master(conn.config_path, conn.runtime_dir, haproxy_bin=str(wrapper))

    def start_keepalived(self, host: Host) -> None:
        """keepalived as the host's supervisor would run it, with the config Spillway pushed.

        Started in the initial network namespace and moved into the host's by `net_namespace` (a
        one-line wrapper that includes the pushed file): keepalived opens the kernel's process-event
        connector, which exists only in the initial namespace, before it switches, so `track_process`
        sees the host's HAProxy die. Under `ip netns exec` it would get ECONNREFUSED and never hear of it.
        """
        run = host.runtime_dir
        wrapper = host.dir / "keepalived-host.conf"
        wrapper.write_text(f"net_namespace {host.netns}\ninclude {host.config_dir}/current/{KEEPALIVED_NAME}\n")
        log = (host.dir / "keepalived.log").open("ab")
        try:
            host.procs["keepalived"] = subprocess.Popen([
                KEEPALIVED_BIN, "--dont-fork", "--log-console", "--vrrp", "-f", str(wrapper),
                "-p", f"{run}/{KEEPALIVED_PID_NAME}", "-r", f"{run}/vrrp.pid", "-c", f"{run}/checkers.pid",
            ], stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        finally:
            log.close()
        deadline = time.monotonic() + 5.0
        while not (Path(run) / KEEPALIVED_PID_NAME).exists():
            if time.monotonic() > deadline or host.procs["keepalived"].poll() is not None:
                raise AssertionError(f"keepalived did not start on {host.name}: "
                                     f"{(host.dir / 'keepalived.log').read_text()[-2000:]}")
            time.sleep(0.02)

    def _wait_tcp(self, host: Host, address: str, port: int, banner: bytes, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with socket.create_connection((address, port), timeout=1.0) as sock:
                    if sock.recv(64).startswith(banner):
                        return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"{host.name}: nothing answered on {address}:{port}")
            time.sleep(0.05)

    # --- observation ---------------------------------------------------------------------------------
    def holders(self, vip: str) -> list[str]:
        """Hosts whose eth0 carries `vip` now (read inside each namespace)."""
        found = []
        for host in self.hosts:
            out = sh("ip", "-n", host.netns, "-o", "addr", "show", "dev", IFACE, check=False).stdout
            if f" {vip}/" in out:
                found.append(host.name)
        return found

    def ssh_fields(self, host: Host) -> dict[str, object]:
        """Node model fields for reaching `host` through the SSH transport."""
        return {"address": host.address, "transport": "ssh", "ssh_host": host.address, "ssh_port": 22,
                "ssh_user": "root", "ssh_known_hosts": host.host_key_pub, "runtime_dir": host.runtime_dir,
                "config_dir": host.config_dir, "haproxy_bin": host.haproxy_bin, "vrrp_interface": IFACE}


def processes_in(namespaces: set[int]) -> list[int]:
    """PIDs of the processes in these network namespaces (a deleted namespace lives on while one of them does)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(entry / "ns" / "net").st_ino in namespaces:
                    found.append(int(entry.name))
    return found
