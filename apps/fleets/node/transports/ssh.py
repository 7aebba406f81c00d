"""SshTransport: a node reached over SSH with asyncssh, needing nothing on the node but
sshd (with SFTP, TCP and streamlocal forwarding allowed, as OpenSSH does by default)
and haproxy.

* files: SFTP into the staging dir, ``posix-rename@openssh.com`` for the atomic swaps;
* validation: ``haproxy -c -dW`` run on the node;
* HAProxy sockets: asyncssh's ``open_unix_connection`` (direct-streamlocal) to the
  node's master/stats sockets -- no socat, no remote Python;
* listener probes: ``open_connection`` (direct-tcpip), so the TCP connect is made by
  the node's sshd, from the node's side.

asyncssh is async and callers (Celery tasks) are sync: one daemon thread per process
runs an event loop, and each call is submitted to it. A connection is kept per
transport and reopened once if it drops.

Host keys: checked against ``NodeConn.ssh_known_hosts`` only -- never ``known_hosts=None``,
never the user's ~/.ssh files. A line may be a full known_hosts line or just
"<keytype> <base64>"; the latter is pinned for this node's host and port.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import posixpath
import shlex
import threading
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import asyncssh

from apps.fleets.config.digest import set_digest
from apps.fleets.node.runtime_api import RuntimeUnavailable, Sender
from apps.fleets.node.transports.base import (
    FileSetTransport,
    HostKeyMismatch,
    NodeConn,
    PushResult,
    TransportError,
    file_mode,
)
from apps.fleets.node.transports.digests import recorded_digest, remember_digest

T = TypeVar("T")
_KEYTYPE_PREFIXES = ("ssh-", "ecdsa-", "sk-ssh-", "sk-ecdsa-", "rsa-sha2-")
_MAX_SOCKET_ANSWER_BYTES = 64 * 1024 * 1024


async def _read_to_eof(reader: asyncssh.SSHReader, socket_path: str) -> bytes:
    """The whole answer: `reader.read(n)` returns as soon as any data has arrived, so one call cut a large
    answer (`show map`, `show stat` at many pools) at the first packets the channel held."""
    chunks: list[bytes] = []
    received = 0
    while chunk := await reader.read(1 << 20):
        received += len(chunk)
        if received > _MAX_SOCKET_ANSWER_BYTES:
            raise RuntimeUnavailable(socket_path, "response larger than 64 MiB")
        chunks.append(chunk)
    return b"".join(chunks)


class _LoopThread:
    """One asyncio loop in a daemon thread per process (re-created after a fork,
    since a forked Celery worker does not inherit the parent's threads)."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None
    _pid: int | None = None

    @classmethod
    def loop(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None or cls._pid != os.getpid():
                loop = asyncio.new_event_loop()
                threading.Thread(target=loop.run_forever, name="spillway-ssh-loop", daemon=True).start()
                cls._loop, cls._pid = loop, os.getpid()
            return cls._loop


# One SSH connection (and SFTP session) per node and process, shared by every transport of that node: each rollout,
# health read, drift check and enforcer run opened its own before (bench-chaos counted ~2.5 new connections a second
# per worker at 6 nodes, each a key exchange on the node and here). Touched only by coroutines on the loop thread, so
# no lock but the per-key one that keeps two transports from connecting twice. Keyed by everything that decides what
# the connection is (a changed key or pin connects anew) and the process (the loop does not survive a fork). A
# connection found lost is dropped from here (`_drop`), and the operation reconnects once (`_call`).
_POOL: dict[tuple[Any, ...], tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]] = {}
_POOL_LOCKS: dict[tuple[Any, ...], asyncio.Lock] = {}
# (pool key, config dir) -> the connection on which the node's layout was made sure of (base._ensure_layout): once per
# connection (a node that restarts or loses its link comes back on a new one), not on every push and served record
# (three SFTP requests each, twice per route change).
_LAYOUT: dict[tuple[Any, ...], asyncssh.SSHClientConnection] = {}
# Old sets are collected after a push returns, as local.py does: listing and removing them held every route change's
# push for several SFTP round trips. base._gc_sets keeps any set newer than `current`, so a late collection cannot
# remove a push in flight.
_COLLECTOR = ThreadPoolExecutor(max_workers=2, thread_name_prefix="spillway-ssh-gc")
REMEMBER_READ_BYTES = 8 * 1024 * 1024
logger = logging.getLogger(__name__)


def _run_sync(coro: Coroutine[Any, Any, T], timeout_s: float) -> T:
    future = asyncio.run_coroutine_threadsafe(coro, _LoopThread.loop())
    try:
        return future.result(timeout_s)
    except TimeoutError:
        future.cancel()
        raise


def known_hosts_for(node: NodeConn) -> asyncssh.SSHKnownHosts:
    """The pinned host keys as asyncssh known_hosts; refuses an empty pin."""
    host = node.ssh_host or node.address
    pattern = host if node.ssh_port == 22 else f"[{host}]:{node.ssh_port}"
    lines: list[str] = []
    for raw in node.ssh_known_hosts.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        lines.append(f"{pattern} {line}" if line.startswith(_KEYTYPE_PREFIXES) else line)
    if not lines:
        raise TransportError(
            f"node {node.name}: no pinned SSH host key (ssh_known_hosts is empty); refusing to connect"
        )
    try:
        return asyncssh.import_known_hosts("\n".join(lines) + "\n")
    except (ValueError, asyncssh.KeyImportError) as exc:
        raise TransportError(f"node {node.name}: ssh_known_hosts cannot be parsed: {exc}") from exc


class SshTransport(FileSetTransport):
    def __init__(
        self,
        node: NodeConn,
        socket_timeout_s: float = 2.0,
        connect_timeout_s: float = 10.0,
        command_timeout_s: float = 60.0,
    ) -> None:
        if node.transport != "ssh":
            raise ValueError(f"node {node.name} uses transport {node.transport!r}, not 'ssh'")
        if not node.ssh_private_key:
            raise TransportError(f"node {node.name}: no SSH private key")
        super().__init__(node, socket_timeout_s)
        self.connect_timeout_s = connect_timeout_s
        self.command_timeout_s = command_timeout_s
        self._known_hosts = known_hosts_for(node)
        try:
            self._client_key = asyncssh.import_private_key(node.ssh_private_key)
        except (ValueError, asyncssh.KeyImportError) as exc:
            raise TransportError(f"node {node.name}: SSH private key cannot be read: {exc}") from exc
        self._conn: asyncssh.SSHClientConnection | None = None
        self._sftp: asyncssh.SFTPClient | None = None

    @property
    def _host(self) -> str:
        return self.node.ssh_host or self.node.address

    # --- connection -------------------------------------------------------------------
    def _pool_key(self) -> tuple[Any, ...]:
        n = self.node
        digest = hashlib.sha256(f"{n.ssh_private_key}\0{n.ssh_known_hosts}".encode()).hexdigest()
        return (os.getpid(), self._host, n.ssh_port, n.ssh_user, digest)

    async def _connect(self) -> tuple[asyncssh.SSHClientConnection, asyncssh.SFTPClient]:
        key = self._pool_key()
        lock = _POOL_LOCKS.setdefault(key, asyncio.Lock())
        async with lock:
            if self._conn is not None and self._sftp is not None and not self._conn.is_closed():
                return self._conn, self._sftp
            pooled = _POOL.get(key)
            if pooled is not None and not pooled[0].is_closed():
                self._conn, self._sftp = pooled
                return pooled
            try:
                conn = await asyncssh.connect(
                    self._host,
                    port=self.node.ssh_port,
                    username=self.node.ssh_user,
                    client_keys=[self._client_key],
                    known_hosts=self._known_hosts,
                    agent_path=None,  # only the node's own key, never a local agent
                    config=[],  # ignore ~/.ssh/config of whoever runs the worker
                    preferred_auth="publickey",
                    connect_timeout=self.connect_timeout_s,
                    # A node that vanishes (link down, power off) sends no RST: without a short keepalive a command
                    # waited on it until TCP gave up (a rollout held 30 s on a rebooting node in bench-chaos).
                    keepalive_interval=5,
                    keepalive_count_max=3,
                )
            except asyncssh.HostKeyNotVerifiable as exc:
                raise HostKeyMismatch(await self._host_key_message(str(exc))) from exc
            except asyncssh.PermissionDenied as exc:
                raise TransportError(
                    f"node {self.node.name}: SSH authentication as {self.node.ssh_user!r} refused "
                    f"by {self._host}:{self.node.ssh_port}"
                ) from exc
            except (OSError, asyncssh.Error, TimeoutError) as exc:
                raise TransportError(
                    f"node {self.node.name}: cannot connect to {self._host}:{self.node.ssh_port} over SSH: "
                    f"{exc or type(exc).__name__}"
                ) from exc
            try:
                sftp = await conn.start_sftp_client()
            except (asyncssh.Error, OSError) as exc:
                conn.close()
                raise TransportError(f"node {self.node.name}: SFTP is not available: {exc}") from exc
            self._conn, self._sftp = conn, sftp
            _POOL[key] = (conn, sftp)
            return conn, sftp

    async def _host_key_message(self, reason: str) -> str:
        presented = "unknown"
        with contextlib.suppress(Exception):
            key = await asyncio.wait_for(
                asyncssh.get_server_host_key(self._host, self.node.ssh_port, config=[]),
                self.connect_timeout_s,
            )
            if key is not None:
                presented = f"{key.get_algorithm()} {key.get_fingerprint()}"
        return (
            f"node {self.node.name}: the SSH host key of {self._host}:{self.node.ssh_port} does not match "
            f"the pinned key (server presented {presented}; {reason}). If the node was reinstalled, "
            "update its pinned host key; otherwise this may be a different machine: nothing was sent."
        )

    def _drop(self) -> None:
        """Forget and close a connection found lost (for every transport of the node: it leaves the pool)."""
        conn, self._conn, self._sftp = self._conn, None, None
        if conn is not None:
            key = self._pool_key()
            if key in _POOL and _POOL[key][0] is conn:
                del _POOL[key]
            conn.close()

    def _call(
        self,
        op: Callable[[asyncssh.SSHClientConnection, asyncssh.SFTPClient], Awaitable[T]],
        timeout_s: float | None = None,
    ) -> T:
        """Run ``op`` on the loop with a live connection; reconnect once if it dropped."""
        timeout = timeout_s if timeout_s is not None else self.command_timeout_s

        async def attempt() -> T:
            conn, sftp = await self._connect()
            return await op(conn, sftp)

        for retry in (True, False):
            try:
                return _run_sync(attempt(), timeout + self.connect_timeout_s)
            except (
                asyncssh.ConnectionLost,
                asyncssh.DisconnectError,
                BrokenPipeError,
                ConnectionResetError,
            ) as exc:
                if isinstance(exc, asyncssh.HostKeyNotVerifiable):
                    raise
                _run_sync(self._close_async(), 5.0)
                if not retry:
                    raise TransportError(f"node {self.node.name}: SSH connection lost: {exc}") from exc
            except TimeoutError as exc:
                raise TransportError(f"node {self.node.name}: SSH operation timed out after {timeout:.0f}s") from exc
        raise AssertionError("unreachable")

    async def _close_async(self) -> None:
        self._drop()

    def connect(self) -> None:
        """Open the connection now (otherwise the first operation does)."""
        self._call(lambda conn, sftp: asyncio.sleep(0))

    def close(self) -> None:
        """Let go of the node's connection; it stays open in the pool for the node's next transport."""
        self._conn, self._sftp = None, None

    # --- primitives --------------------------------------------------------------------
    def _sender(self, socket_path: str) -> Sender:
        def send(command: str, timeout_s: float) -> str:
            async def op(conn: asyncssh.SSHClientConnection, _sftp: asyncssh.SFTPClient) -> str:
                try:
                    reader, writer = await asyncio.wait_for(
                        conn.open_unix_connection(socket_path, encoding=None), timeout_s
                    )
                except asyncssh.ChannelOpenError as exc:
                    raise RuntimeUnavailable(socket_path, f"via SSH: {exc.reason}") from exc
                except TimeoutError as exc:
                    raise RuntimeUnavailable(socket_path, f"via SSH: no channel within {timeout_s:.1f}s") from exc
                try:
                    writer.write(command.encode() + b"\n")
                    writer.write_eof()  # the master CLI answers and closes only after EOF
                    data = await asyncio.wait_for(_read_to_eof(reader, socket_path), timeout_s)
                except TimeoutError as exc:
                    raise RuntimeUnavailable(socket_path, f"no complete answer within {timeout_s:.1f}s") from exc
                except (asyncssh.Error, OSError):
                    # The master drops the channel when it re-executes on `reload`.
                    data = b""
                finally:
                    writer.close()
                return data.decode("utf-8", errors="replace")

            return self._call(op, timeout_s + 1.0)

        return send

    def _after_push(self) -> None:
        _COLLECTOR.submit(self._collect)

    def _collect(self) -> None:
        try:
            self._gc_sets()
        except (TransportError, asyncssh.Error, OSError) as exc:  # the next push collects them
            logger.info("node %s: old config sets not collected: %s", self.node.name, exc)

    def _ensure_layout(self) -> None:
        key = (self._pool_key(), self.node.config_dir)
        if self._conn is not None and _LAYOUT.get(key) is self._conn and not self._conn.is_closed():
            return
        super()._ensure_layout()
        if self._conn is not None:
            _LAYOUT[key] = self._conn

    def _makedirs(self, path: str, mode: int) -> None:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> None:
            await sftp.makedirs(path, exist_ok=True)
            await sftp.chmod(path, mode)

        self._call(op)

    @staticmethod
    async def _put(sftp: asyncssh.SFTPClient, path: str, data: bytes, mode: int) -> None:
        # Permissions set at open time so a cert is never world-readable, even briefly.
        async with sftp.open(path, "wb", attrs=asyncssh.SFTPAttrs(permissions=mode)) as handle:
            await handle.write(data)
            with contextlib.suppress(asyncssh.SFTPError):
                await handle.fsync()
        await sftp.chmod(path, mode)  # the server's umask may have trimmed the open mode

    def _write_file(self, path: str, data: bytes, mode: int) -> None:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> None:
            await self._put(sftp, path, data, mode)

        self._call(op)

    def _write_set(self, set_dir: str, files: Mapping[str, bytes]) -> None:
        """One coroutine for the whole set: SFTP requests are pipelined instead of paying a round trip (and a thread
        hop) per file.

        A file the current set holds with the same content, as this process pushed or read it, is hard-linked
        (OpenSSH's hardlink@openssh.com), not written and fsynced again (a route change keeps every map it does not
        move: the very bytes object, compared by identity first), while that set's signature is as recorded (an
        edit on the node must not reach the new set). Sets are never modified in place, so two sets sharing an inode
        is safe (as in local.py)."""
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> None:
            try:
                state = await self._state(sftp, self.node.current_dir)
            except asyncssh.SFTPNoSuchFile:  # collected under the listing: nothing to link from
                state = None
            known = recorded_digest(self._set_key(state[0])) if state is not None else None
            pushed = known[2] if known is not None and known[0] == state[1] and known[2] is not None else {}
            for parent in sorted({posixpath.dirname(name) for name in files} - {""}):
                path = posixpath.join(set_dir, parent)
                await sftp.makedirs(path, exist_ok=True)
                await sftp.chmod(path, 0o700 if parent.startswith("certs") else 0o755)
            limit = asyncio.Semaphore(16)

            async def put(name: str) -> None:
                async with limit:
                    target = posixpath.join(set_dir, name)
                    kept = pushed.get(name)
                    if state is not None and kept is not None and (kept is files[name] or kept == files[name]):
                        try:
                            await sftp.link(posixpath.join(state[0], name), target)
                            return
                        except asyncssh.SFTPError:  # no hardlink extension: written the ordinary way
                            pass
                    await self._put(sftp, target, files[name], file_mode(name))

            await asyncio.gather(*(put(name) for name in sorted(files)))

        self._call(op)

    def _read_file(self, path: str) -> bytes | None:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> bytes | None:
            try:
                async with sftp.open(path, "rb") as handle:
                    return await handle.read()
            except asyncssh.SFTPNoSuchFile:
                return None

        return self._call(op)

    def _read_tail(self, path: str, max_bytes: int) -> bytes | None:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> bytes | None:
            try:
                size = (await sftp.stat(path)).size or 0
                async with sftp.open(path, "rb") as handle:
                    await handle.seek(max(0, size - max_bytes))
                    return await handle.read()
            except (asyncssh.SFTPNoSuchFile, asyncssh.SFTPPermissionDenied):
                return None

        return self._call(op)

    def _rename(self, src: str, dst: str, sync: bool = True) -> None:  # SFTP offers no fsync of a directory
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> None:
            await sftp.posix_rename(src, dst)

        self._call(op)

    def _symlink(self, target: str, link: str) -> None:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> None:
            await sftp.symlink(target, link)

        self._call(op)

    def _readlink(self, path: str) -> str | None:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> str | None:
            try:
                return str(await sftp.readlink(path))
            except asyncssh.SFTPError:
                return None

        return self._call(op)

    def _listdir(self, path: str) -> list[str]:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> list[str]:
            try:
                names = await sftp.listdir(path)
            except asyncssh.SFTPNoSuchFile:
                return []
            return [str(n) for n in names if n not in (".", "..")]

        return self._call(op)

    def _rmtree(self, path: str) -> None:
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> None:
            await sftp.rmtree(path, ignore_errors=True)

        self._call(op)

    # --- the digest of what the node serves ------------------------------------------
    def push(self, bundle, validate=True):  # type: ignore[no-untyped-def]
        result: PushResult = super().push(bundle, validate)
        if result.ok and result.set_id:
            with contextlib.suppress(TransportError, asyncssh.SFTPError):  # only a read saved for the next rollout
                state = self._set_state(posixpath.join(self.node.sets_dir, result.set_id))
                if state is not None:  # the files as pushed too: the next push links those it keeps (_write_set)
                    remember_digest(self._set_key(state[0]), state[1], result.sha256, dict(bundle.files))
        return result

    def config_sha256(self, fresh: bool = False) -> str | None:
        """A rollout's question (is the node on its last good set?) is answered from the digest remembered for the
        set `current` points to while its signature holds (base.remember_digest); reading and hashing every file
        over SFTP took a third of each route change's time on a busy SSH node. A drift check (`fresh`) reads the
        files, so an edit within the same second that kept the size is seen too."""
        for _attempt in range(3):
            try:
                state = self._set_state(self.node.current_dir)
                if state is None:
                    return None
                root, signature = state
                key = self._set_key(root)
                known = None if fresh else recorded_digest(key)
                if known is not None and known[0] == signature:
                    return known[1]
                files = self._read_tree(root)
                digest = set_digest(files)
            except asyncssh.SFTPNoSuchFile:
                continue  # the set was collected under the read (a push moved `current` meanwhile): look again
            # The files read too (a few MB at most): the next push links those it keeps, as after a push of its own
            # (a worker that took over a fleet, or restarted, wrote every file of its first push again).
            small = sum(len(data) for data in files.values()) <= REMEMBER_READ_BYTES
            remember_digest(key, signature, digest, files if small else None)
            return digest
        raise TransportError(f"node {self.node.name}: its current config set moved under every read")

    def _set_key(self, root: str) -> tuple[str, int, str]:
        return (self._host, self.node.ssh_port, root)

    def _set_state(self, path: str) -> tuple[str, tuple] | None:
        """The real path of the set at `path` (`current` resolved) and its signature (_signature). None when missing."""
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> tuple[str, tuple] | None:
            return await self._state(sftp, path)

        return self._call(op)

    @classmethod
    async def _state(cls, sftp: asyncssh.SFTPClient, path: str) -> tuple[str, tuple] | None:
        try:
            base = str(await sftp.realpath(path))
            if not await sftp.isdir(base):
                return None
        except asyncssh.SFTPError:
            return None
        return base, await cls._signature(sftp, base)

    @staticmethod
    async def _signature(sftp: asyncssh.SFTPClient, base: str) -> tuple:
        """Each file's name, type, mode, size and mtime (seconds: SFTP v3) under `base`, from one directory listing
        per directory: no file is read."""
        entries: list[tuple] = []

        async def walk(directory: str, prefix: str) -> None:
            for entry in await sftp.readdir(directory):
                name = str(entry.filename)
                if name in (".", ".."):
                    continue
                attrs = entry.attrs
                if attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
                    await walk(posixpath.join(directory, name), f"{prefix}{name}/")
                entries.append((f"{prefix}{name}", attrs.type, attrs.permissions, attrs.size, attrs.mtime))

        await walk(base, "")
        return tuple(sorted(entries))

    def _read_tree(self, root: str) -> dict[str, bytes]:
        """Every regular file under `root`, by relative path. The files are read concurrently (pipelined requests,
        as _write_set writes them): one after another, a cold read of a set took ~1.5 s of a shard worker's first
        rollout after it took a fleet over in bench-chaos."""
        async def op(_conn: asyncssh.SSHClientConnection, sftp: asyncssh.SFTPClient) -> dict[str, bytes]:
            base = await sftp.realpath(root)
            paths: dict[str, str] = {}

            async def walk(directory: str, prefix: str) -> None:
                for entry in await sftp.readdir(directory):
                    name = str(entry.filename)
                    if name in (".", ".."):
                        continue
                    full = posixpath.join(directory, name)
                    if entry.attrs.type == asyncssh.FILEXFER_TYPE_DIRECTORY:
                        await walk(full, f"{prefix}{name}/")
                    elif entry.attrs.type == asyncssh.FILEXFER_TYPE_REGULAR:
                        paths[f"{prefix}{name}"] = full

            await walk(str(base), "")
            limit = asyncio.Semaphore(16)

            async def read(full: str) -> bytes:
                async with limit, sftp.open(full, "rb") as handle:
                    return await handle.read()

            contents = await asyncio.gather(*(read(full) for full in paths.values()))
            return dict(zip(paths, contents, strict=True))

        return self._call(op)

    def _run(self, argv: list[str], cwd: str, timeout_s: float) -> tuple[int, str]:
        command = f"cd {shlex.quote(cwd)} && exec {shlex.join(argv)}"

        async def op(conn: asyncssh.SSHClientConnection, _sftp: asyncssh.SFTPClient) -> tuple[int, str]:
            result = await conn.run(command, check=False, stderr=asyncssh.STDOUT, timeout=timeout_s)
            output = result.stdout if isinstance(result.stdout, str) else (result.stdout or b"").decode()
            if result.exit_status is None and result.exit_signal is None:
                # The channel closed without an exit status: the connection was lost under the command (the
                # node rebooted or its link went away), it did not fail. Read as exit code -1 this was "the node
                # refused the config" with no output (a failed rollout, not retried with the same revision);
                # raised, `_call` reconnects and runs it again (validation, HUP and `ip addr` are idempotent),
                # or the node is reported unreachable.
                raise asyncssh.ConnectionLost(f"connection lost while running {argv[0]}")
            code = result.exit_status if result.exit_status is not None else -1
            return code, output

        try:
            return self._call(op, timeout_s + 1.0)
        except asyncssh.ProcessError as exc:
            raise TransportError(f"node {self.node.name}: {argv[0]} failed to run: {exc}") from exc

    def _probe(self, host: str, port: int, timeout_s: float) -> bool:
        async def op(conn: asyncssh.SSHClientConnection, _sftp: asyncssh.SFTPClient) -> bool:
            try:
                _reader, writer = await asyncio.wait_for(conn.open_connection(host, port), timeout_s)
            except (asyncssh.ChannelOpenError, TimeoutError):
                return False
            writer.close()
            return True

        return self._call(op, timeout_s + 1.0)
