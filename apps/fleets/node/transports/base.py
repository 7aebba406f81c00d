"""Transport contract and the config-set logic shared by the local and SSH transports.

Layout on a node (same for every transport)::

    <config_dir>/current   -> sets/<id>     HAProxy runs with -f <config_dir>/current/haproxy.cfg
    <config_dir>/previous  -> sets/<id>     the set before the last push: rollback target
    <config_dir>/sets/<id>/haproxy.cfg, maps/..., certs/...
    <config_dir>/sets/.staging-<id>/        a push in progress (validated here)
    <runtime_dir>/master.sock               master CLI (-S), see apps.fleets.node.process
    <runtime_dir>/stats.sock                stats socket: the config must declare it
    <runtime_dir>/server-state              server-state-file: the config must declare it
    <config_dir>/current/keepalived.conf    nodes taking part in VRRP: keepalived runs with -f this path
    <runtime_dir>/keepalived.pid            and -p this pid file, so a push reloads it with SIGHUP

Why a directory symlink swap: a push writes a whole new directory, validates it where
it lies, then replaces the ``current`` symlink with ``rename(2)``, which is atomic. A
reader (HAProxy reloading) resolves ``current`` once per path it opens and sees either
the old set or the new one. Replacing files one by one could leave haproxy.cfg new
and a map old if the push dies half-way; the symlink swap never leaves a mixed set.
The one remaining window -- a swap while HAProxy is in the middle of reading its
files -- is closed by the caller, which serialises push and activate per node.

Rendered configs should use ``default-path config`` in ``global`` and relative
``maps/x.map`` / ``certs/x.pem`` paths: they then resolve against the directory of
the haproxy.cfg being read, so the staging copy is validated with its own maps and
the live config reads ``current/maps`` (absolute ``current/...`` paths would validate
the staged haproxy.cfg against the *old* maps).
"""

from __future__ import annotations

import functools
import logging
import posixpath
import re
import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

from apps.fleets.config.digest import set_digest
from apps.fleets.node.runtime_api import (
    HAProxySocket,
    MasterSocket,
    ProcInfo,
    ReloadResult,
    RuntimeUnavailable,
    Sender,
)

logger = logging.getLogger(__name__)

CONFIG_NAME = "haproxy.cfg"
KEEPALIVED_NAME = "keepalived.conf"
KEEPALIVED_PID_NAME = "keepalived.pid"
KEEPALIVED_BIN = "keepalived"
STATS_SOCKET_NAME = "stats.sock"
MASTER_SOCKET_NAME = "master.sock"
SERVER_STATE_NAME = "server-state"
# Beside `current`: which revision of which fleet the node was last given (JSON, rollout/restore.py). Outside the
# config sets, so it is in no bundle's digest. A database restored from a backup is told apart from drift by it.
SERVED_NAME = "served.json"
# An old set kept for a later push (local.py), under sets/: neither a set nor a push in flight.
SPARE_PREFIX = ".spare-"
LOG_NAME = "haproxy.log"  # where apps.fleets.node.process points the master's stdout/stderr
# An empty server-state file makes `haproxy -c -dW` fail ("Can't get version"), and a
# missing one too ("Can't open"); the bare version line is a valid empty state.
EMPTY_SERVER_STATE = b"1\n"
MAX_SOCKET_PATH_BYTES = 97
_NAME_PART_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class ConfigBundleLike(Protocol):
    """What a push needs from ``apps.fleets.config.spec.ConfigBundle``."""

    @property
    def files(self) -> Mapping[str, bytes]: ...

    @property
    def sha256(self) -> str: ...


@dataclass(frozen=True)
class NodeConn:
    """How to reach one HAProxy node. ``ssh_private_key`` is decrypted PEM text (the caller
    decrypts it); ``ssh_known_hosts`` holds the pinned host key line(s)."""

    name: str
    address: str
    runtime_dir: str
    config_dir: str
    haproxy_bin: str = "haproxy"
    transport: Literal["local", "ssh"] = "local"
    ssh_host: str = ""
    ssh_port: int = 22
    ssh_user: str = "root"
    ssh_private_key: str = field(default="", repr=False)
    ssh_known_hosts: str = ""

    def __post_init__(self) -> None:
        # HAProxy 2.6 refuses unix socket paths longer than 97 bytes ("socket path too long").
        longest = max(len(self.stats_socket_path.encode()), len(self.master_socket_path.encode()))
        if longest > MAX_SOCKET_PATH_BYTES:
            raise ValueError(
                f"node {self.name}: runtime_dir {self.runtime_dir!r} is too long: HAProxy accepts unix "
                f"socket paths of at most {MAX_SOCKET_PATH_BYTES} bytes (a short path such as /run/spillway)"
            )

    @property
    def current_dir(self) -> str:
        return posixpath.join(self.config_dir, "current")

    @property
    def previous_dir(self) -> str:
        return posixpath.join(self.config_dir, "previous")

    @property
    def sets_dir(self) -> str:
        return posixpath.join(self.config_dir, "sets")

    @property
    def config_path(self) -> str:
        """The path HAProxy is started with (``-f``); stable across pushes."""
        return posixpath.join(self.current_dir, CONFIG_NAME)

    @property
    def stats_socket_path(self) -> str:
        return posixpath.join(self.runtime_dir, STATS_SOCKET_NAME)

    @property
    def master_socket_path(self) -> str:
        return posixpath.join(self.runtime_dir, MASTER_SOCKET_NAME)

    @property
    def server_state_path(self) -> str:
        return posixpath.join(self.runtime_dir, SERVER_STATE_NAME)


@dataclass(frozen=True)
class PushResult:
    ok: bool
    sha256: str  # set_digest of what was written, i.e. what config_sha256() reports after a push
    validation_output: str  # `haproxy -c -dW` stdout+stderr as the node printed it
    duration_ms: float
    set_id: str | None = None


class TransportError(Exception):
    """The node could not be reached or an operation on it failed (not a validation failure)."""


class HostKeyMismatch(TransportError):
    """The SSH server's host key is not the pinned one: possibly a different machine."""


_SET_ID_RE = re.compile(r"^[0-9a-f]{1,64}-(?P<ns>[0-9]{1,20})-[0-9a-f]{6}$")


def _set_time(set_id: str) -> int | None:
    """When a set was pushed (the time_ns in its id, push()), None for a name push() does not make."""
    match = _SET_ID_RE.match(set_id)
    return int(match.group("ns")) if match else None



_BACKEND_LINE = re.compile(r"^backend\s+(\S+)")
_SERVER_LINE = re.compile(r"^\s+server\s+(\S+)\s+(\S+)")


def config_server_addresses(config: str) -> dict[tuple[str, str], tuple[str, str]]:
    """{(backend, server): (address, port)} of the static servers a haproxy.cfg declares."""
    out: dict[tuple[str, str], tuple[str, str]] = {}
    backend = ""
    for line in config.splitlines():
        if not line.strip():
            continue  # a blank line inside a section does not end it
        if not line[:1].isspace():
            found = _BACKEND_LINE.match(line)
            backend = found.group(1) if found else ""
            continue
        server = _SERVER_LINE.match(line) if backend else None
        if server:
            address, _, port = server.group(2).rpartition(":")
            out[(backend, server.group(1))] = (address.strip("[]"), port)
    return out


def state_without_moved_servers(state: str, config: str) -> str:
    """`show servers state` text minus the servers whose address or port differs in `config`.

    HAProxy applies a saved server's port (and, for some, address) over the config's on reload
    (haproxy/haproxy#985, #1412, #3296: "works as designed"): a member moved to another port kept
    serving at the old one after the reload that was to move it. The maintainers' workaround is this one:
    a server missing from the state file takes everything from the config (it loses only its runtime
    drain/weight, which the config carries too: apps.fleets.config.render writes both).
    Columns (format 1): be_id be_name srv_id srv_name srv_addr ... srv_port is the 19th.
    """
    wanted = config_server_addresses(config)
    kept = []
    for line in state.splitlines(keepends=True):
        cols = line.split()
        if len(cols) > 18 and not line.startswith("#"):
            declared = wanted.get((cols[1], cols[3]))
            if declared is not None and declared != (cols[4], cols[18]):
                continue
        kept.append(line)
    return "".join(kept)


def check_bundle_names(files: Mapping[str, bytes]) -> None:
    """Only ``haproxy.cfg``, ``keepalived.conf``, ``maps/<name>`` and ``certs/<name>``: nothing may
    escape the set."""
    _check_names(tuple(files))


@functools.lru_cache(maxsize=64)
def _check_names(names: tuple[str, ...]) -> None:
    """check_bundle_names of these names, once (a rollout's nodes push the same names, change after change; an
    exception is not remembered, so a refused set of names is checked and refused again)."""
    if CONFIG_NAME not in names:
        raise ValueError("a config bundle must contain haproxy.cfg")
    for name in names:
        if name in (CONFIG_NAME, KEEPALIVED_NAME):
            continue
        top, _, rest = name.partition("/")
        if top not in ("maps", "certs") or not rest:
            raise ValueError(f"bundle file {name!r}: only haproxy.cfg, maps/<name> and certs/<name> are allowed")
        if not all(_NAME_PART_RE.match(part) for part in rest.split("/")):
            raise ValueError(f"bundle file {name!r}: each path part must be [A-Za-z0-9][A-Za-z0-9_.-]*")


def file_mode(name: str) -> int:
    return 0o600 if name.startswith("certs/") else 0o644


@runtime_checkable
class Transport(Protocol):
    node: NodeConn

    def push(self, bundle: ConfigBundleLike, validate: bool = True) -> PushResult: ...

    def activate(self, timeout_s: float = 10.0) -> ReloadResult: ...

    def rollback(self, timeout_s: float = 10.0) -> ReloadResult: ...

    def config_sha256(self, fresh: bool = False) -> str | None: ...

    def runtime(self, command: str) -> str: ...

    def stats(self) -> HAProxySocket: ...

    def master(self) -> MasterSocket: ...

    def show_proc(self) -> ProcInfo: ...

    def probe_listeners(
        self, addresses: Iterable[tuple[str, int]], timeout_s: float = 1.0
    ) -> dict[tuple[str, int], bool]: ...

    def close(self) -> None: ...


class FileSetTransport(ABC):
    """Push/activate/rollback written once over a handful of node primitives.

    Subclasses implement the primitives for their way of reaching the node; every
    path they receive is an absolute POSIX path on the node.
    """

    validate_timeout_s: float = 60.0

    def __init__(self, node: NodeConn, socket_timeout_s: float = 2.0) -> None:
        self.node = node
        self.socket_timeout_s = socket_timeout_s

    # --- primitives -------------------------------------------------------------
    @abstractmethod
    def _sender(self, socket_path: str) -> Sender: ...

    @abstractmethod
    def _makedirs(self, path: str, mode: int) -> None: ...

    @abstractmethod
    def _write_file(self, path: str, data: bytes, mode: int) -> None: ...

    @abstractmethod
    def _read_file(self, path: str) -> bytes | None: ...

    @abstractmethod
    def _read_tail(self, path: str, max_bytes: int) -> bytes | None:
        """The last ``max_bytes`` of a file, None if it does not exist."""

    @abstractmethod
    def _rename(self, src: str, dst: str, sync: bool = True) -> None:
        """rename(2): atomically replaces ``dst`` (file or symlink); `sync`: durable before it returns, where the
        transport can make it so (a later synced rename in the same directory makes this one durable too)."""

    @abstractmethod
    def _symlink(self, target: str, link: str) -> None: ...

    @abstractmethod
    def _readlink(self, path: str) -> str | None: ...

    @abstractmethod
    def _listdir(self, path: str) -> list[str]: ...

    @abstractmethod
    def _rmtree(self, path: str) -> None: ...

    @abstractmethod
    def _read_tree(self, root: str) -> dict[str, bytes]:
        """All regular files under ``root`` (following ``root`` itself if a symlink)."""

    @abstractmethod
    def _run(self, argv: list[str], cwd: str, timeout_s: float) -> tuple[int, str]:
        """Run a command on the node; returns (exit code, stdout+stderr)."""

    @abstractmethod
    def _probe(self, host: str, port: int, timeout_s: float) -> bool: ...

    def run_command(self, argv: list[str], timeout_s: float) -> tuple[int, str]:
        """(exit code, output) of a fixed command on the node (never built from user input)."""
        return self._run(argv, "/", timeout_s)

    def _write_set(self, set_dir: str, files: Mapping[str, bytes]) -> None:
        """Write a bundle's files under ``set_dir`` (certs 0600 in a 0700 dir, the rest 0644).
        Subclasses may override to batch round trips."""
        for parent in sorted({posixpath.dirname(name) for name in files} - {""}):
            self._makedirs(posixpath.join(set_dir, parent), 0o700 if parent.startswith("certs") else 0o755)
        reused = self._link_unchanged(set_dir, files)
        self._write_files(set_dir, {name: data for name, data in files.items() if name not in reused})

    def _write_files(self, set_dir: str, files: Mapping[str, bytes]) -> None:
        for name in sorted(files):
            self._write_file(posixpath.join(set_dir, name), files[name], file_mode(name))

    def _link_unchanged(self, set_dir: str, files: Mapping[str, bytes]) -> set[str]:
        """Put files whose content the current set already has into ``set_dir`` without writing them
        again; the names done. None by default (every file is written)."""
        return set()

    def close(self) -> None:  # noqa: B027 -- optional hook, nothing to release by default
        pass

    def __enter__(self) -> FileSetTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- sockets ------------------------------------------------------------------
    def stats(self) -> HAProxySocket:
        path = self.node.stats_socket_path
        return HAProxySocket(path, self.socket_timeout_s, send=self._sender(path))

    def master(self) -> MasterSocket:
        path = self.node.master_socket_path
        return MasterSocket(path, self.socket_timeout_s, send=self._sender(path))

    def runtime(self, command: str) -> str:
        return self.stats().command(command)

    def show_proc(self) -> ProcInfo:
        return self.master().show_proc()

    def probe_listeners(
        self, addresses: Iterable[tuple[str, int]], timeout_s: float = 1.0
    ) -> dict[tuple[str, int], bool]:
        return {(host, port): self._probe(host, port, timeout_s) for host, port in addresses}

    # --- config sets --------------------------------------------------------------
    def _ensure_layout(self) -> None:
        self._makedirs(self.node.runtime_dir, 0o755)
        self._makedirs(self.node.sets_dir, 0o755)
        state = self._read_file(self.node.server_state_path)
        if not state:
            self._write_file(self.node.server_state_path, EMPTY_SERVER_STATE, 0o644)

    def validate_dir(self, set_dir: str) -> tuple[bool, str]:
        """``haproxy -c -dW`` on the node, in the set's directory (-dW: warnings are errors), and
        ``keepalived -t`` on the set's keepalived.conf when it has one."""
        code, output = self._run(
            [self.node.haproxy_bin, "-c", "-dW", "-f", CONFIG_NAME], set_dir, self.validate_timeout_s
        )
        if code != 0 or self._read_file(posixpath.join(set_dir, KEEPALIVED_NAME)) is None:
            return code == 0, output
        ok, keepalived_output = self.validate_keepalived(set_dir)
        return ok, output + keepalived_output

    def validate_keepalived(self, set_dir: str) -> tuple[bool, str]:
        """``keepalived -t`` (it also checks that the VRRP interface exists on the node). A node
        without the binary cannot serve a VIP at all, so that refuses the push too."""
        try:
            code, output = self._run([KEEPALIVED_BIN, "-t", "-l", "-f", KEEPALIVED_NAME], set_dir,
                                     self.validate_timeout_s)
        except TransportError as exc:
            return False, f"\nkeepalived -t: {exc}\n"
        # -t prints its complaints (and "VRRP version 3 does not support authentication"-style warnings).
        return code == 0, (f"\nkeepalived -t exited {code}:\n{output}" if code or output.strip() else "")

    def reload_keepalived(self) -> str | None:
        """SIGHUP the node's keepalived so it reads ``current/keepalived.conf``; None or what is wrong."""
        pid_path = posixpath.join(self.node.runtime_dir, KEEPALIVED_PID_NAME)
        raw = self._read_file(pid_path)
        pid = (raw or b"").decode(errors="replace").strip()
        if not pid.isdigit():
            return f"keepalived is not running on node {self.node.name} (no pid in {pid_path}): its VIPs cannot move"
        code, output = self._run(["kill", "-HUP", pid], "/", 5.0)
        return None if code == 0 else f"keepalived reload (kill -HUP {pid}) failed: {output.strip()}"

    def vrrp_addresses(self) -> set[str]:
        """Addresses configured on the node's interfaces now (`ip -o addr`): which VIPs it holds."""
        code, output = self._run(["ip", "-o", "addr", "show"], "/", 5.0)
        if code != 0:
            raise TransportError(f"node {self.node.name}: ip addr failed: {output.strip()}")
        held = set()
        for line in output.splitlines():
            words = line.split()
            if len(words) > 3 and words[2] in ("inet", "inet6"):
                held.add(words[3].partition("/")[0])
        return held

    def push(self, bundle: ConfigBundleLike, validate: bool = True) -> PushResult:
        """Upload into staging, validate on the node, then swap ``current`` atomically.

        A refused bundle leaves ``current`` untouched; the staging dir is removed. validate=False only for
        what the node's own haproxy already took (apply._hot_apply: map entries its worker accepted).
        """
        start = time.monotonic()
        files = dict(bundle.files)
        check_bundle_names(files)
        # A renderer's bundle carries this very hash (config.digest.set_digest, the same definition): at 100k
        # routes hashing its 5 MB again cost each node ~10 ms per route change.
        sha = getattr(bundle, "sha256", "") or set_digest(files)
        self._ensure_layout()
        set_id = f"{sha[:12]}-{time.time_ns()}-{secrets.token_hex(3)}"
        staging = posixpath.join(self.node.sets_dir, f".staging-{set_id}")
        self._make_staging(staging)
        try:
            self._write_set(staging, files)
            valid, output = self.validate_dir(staging) if validate else (True, "taken by the running worker")
        except BaseException:
            self._rmtree(staging)
            raise
        if not valid:
            self._rmtree(staging)
            return PushResult(False, sha, output, (time.monotonic() - start) * 1000.0)
        final = posixpath.join(self.node.sets_dir, set_id)
        self._rename(staging, final)
        old = self._readlink(self.node.current_dir)
        # previous first: a crash between the two swaps leaves previous == current
        # (a harmless no-op rollback) rather than a rollback to an older set. Both links are in one directory,
        # whose sync after the second swap makes both durable (one directory fsync less per push: ext4 keeps
        # the two renames in order in its journal).
        if old:
            self._keep_previous(old)
        self._swap_link(self.node.current_dir, posixpath.join("sets", set_id))
        self._after_push()
        return PushResult(True, sha, output, (time.monotonic() - start) * 1000.0, set_id)

    def _after_push(self) -> None:
        """Collect the sets a push left behind; subclasses may do it later, off the push's path."""
        self._gc_sets()

    def _make_staging(self, path: str) -> None:
        """An empty directory for a push to write its set into; subclasses may hand over one made earlier."""
        self._makedirs(path, 0o755)

    def _keep_previous(self, old: str) -> None:
        """Point ``previous`` at ``old``, the set ``current`` points to until the push swaps it."""
        self._swap_link(self.node.previous_dir, old, sync=False)

    def _remove_set(self, path: str) -> None:
        """Remove a set _gc_sets collects; subclasses may keep its directories for a later push."""
        self._rmtree(path)

    def _swap_link(self, link: str, target: str, sync: bool = True) -> None:
        tmp = f"{link}.tmp-{secrets.token_hex(4)}"
        self._symlink(target, tmp)
        self._rename(tmp, link, sync)

    def _gc_sets(self) -> list[str]:
        """Remove every set but ``current`` and ``previous`` that is older than ``current``; the paths removed.

        A set newer than ``current`` may be a push in flight from another process (renamed from staging,
        links not swapped yet), so it stays; it is collected once a later push has moved past it."""
        current, previous = self._readlink(self.node.current_dir), self._readlink(self.node.previous_dir)
        keep = {posixpath.basename(t) for t in (current, previous) if t}
        newest = _set_time(posixpath.basename(current)) if current else None
        removed = []
        for entry in self._listdir(self.node.sets_dir):
            if entry in keep or entry.startswith((".staging-", SPARE_PREFIX)):
                continue
            made = _set_time(entry)
            if newest is not None and made is not None and made > newest:
                continue
            removed.append(posixpath.join(self.node.sets_dir, entry))
            self._remove_set(removed[-1])
        return removed

    def save_server_state(self) -> bool:
        """Dump ``show servers state`` into the server-state file, leaving out each server whose address or
        port the config about to load changed; False if the stats socket is down."""
        try:
            text = self.stats().show_servers_state()
        except RuntimeUnavailable as exc:
            logger.warning("node %s: server state not saved before reload: %s", self.node.name, exc)
            return False
        config = self._read_file(self.node.config_path)
        if config is not None:
            text = state_without_moved_servers(text, config.decode("utf-8", errors="replace"))
        tmp = f"{self.node.server_state_path}.tmp-{secrets.token_hex(4)}"
        self._write_file(tmp, text.encode(), 0o644)
        self._rename(tmp, self.node.server_state_path)
        return True

    def activate(self, timeout_s: float = 10.0) -> ReloadResult:
        """Save runtime server state (drain/maint/weights), reload via the master, verify.

        The caller should then ``probe_listeners`` for every expected bind: a reload
        that raced a port conflict can succeed with a listener left dead (HAPROXY.md).
        """
        self.save_server_state()
        result = self.master().reload_and_verify(timeout_s)
        if result.ok:
            return result
        return ReloadResult(
            ok=False,
            new_worker_pid=None,
            old_worker_pids=result.old_worker_pids,
            error=f"{result.error}\n{self._reload_failure_reason()}",
            duration_ms=result.duration_ms,
        )

    def _reload_failure_reason(self) -> str:
        """HAProxy's own words for a failed reload, where we can find them.

        2.6 prints them only on the master's stderr. A master started by
        apps.fleets.node.process logs to <runtime_dir>/haproxy.log: take the ALERT lines
        after its last "Reloading HAProxy". Otherwise re-validate the live config.
        """
        tail = self._read_tail(posixpath.join(self.node.runtime_dir, LOG_NAME), 32 * 1024)
        if tail:
            last_reload = tail.decode("utf-8", errors="replace").rpartition("Reloading HAProxy")[2]
            alerts = [line for line in last_reload.splitlines() if "[ALERT]" in line]
            if alerts:
                return "HAProxy said:\n" + "\n".join(alerts)
        valid, output = self.validate_dir(self.node.current_dir)
        if not valid:
            return "current config fails `haproxy -c -dW` on the node:\n" + output
        return (
            "current config passes `haproxy -c -dW`, so it failed at startup: most often "
            "a bind address held by another process"
        )

    def rollback(self, timeout_s: float = 10.0) -> ReloadResult:
        """Point ``current`` back at ``previous`` (and ``previous`` at the set rolled away
        from, so a rollback can itself be undone), then activate."""
        previous = self._readlink(self.node.previous_dir)
        if not previous:
            return ReloadResult(False, None, [], "no previous config set to roll back to", 0.0)
        current = self._readlink(self.node.current_dir)
        self._swap_link(self.node.current_dir, previous)
        if current:
            self._swap_link(self.node.previous_dir, current)
        return self.activate(timeout_s)

    def write_served(self, record: bytes) -> None:
        """Replace the node's served.json (written, then renamed: a reader sees the old or the new record)."""
        self._ensure_layout()
        path = posixpath.join(self.node.config_dir, SERVED_NAME)
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        self._write_unsynced(tmp, record, 0o644)
        self._rename(tmp, path, sync=False)

    def _write_unsynced(self, path: str, data: bytes, mode: int) -> None:
        """A small file whose loss in a power cut costs nothing (served.json: the next apply writes it again)."""
        self._write_file(path, data, mode)

    def write_current_file(self, name: str, data: bytes) -> None:
        """Replace one file of the set the node serves, by rename (never in place: sets share unchanged files
        through hard links). Only for files the set's digest counts as rendered (config/digest.py)."""
        path = posixpath.join(self.node.current_dir, name)
        tmp = f"{path}.tmp-{secrets.token_hex(4)}"
        self._write_file(tmp, data, file_mode(name))
        self._rename(tmp, path)

    def read_served(self) -> bytes | None:
        return self._read_file(posixpath.join(self.node.config_dir, SERVED_NAME))

    def read_current_files(self) -> dict[str, bytes]:
        """The files the node serves (under `current`), for showing what a push would change."""
        if self._readlink(self.node.current_dir) is None:
            return {}
        return self._read_tree(self.node.current_dir)

    def config_sha256(self, fresh: bool = False) -> str | None:
        """``set_digest`` of the files under ``current`` as the node has them now. `fresh`: read and hashed
        whatever a subclass remembers (drift checks)."""
        if self._readlink(self.node.current_dir) is None:
            return None
        return set_digest(self._read_tree(self.node.current_dir))
