"""HAProxy runtime API and master CLI clients (sync, one command per connection).

Pure Python, no Django. Two sockets matter on a Spillway node:

* the **stats socket** (``stats socket ... level admin`` in the config, served by the
  worker): ``show stat``, ``set server``, ``show servers state``...
* the **master socket** (``-S path,level,admin`` on the command line): ``show proc``
  and ``reload``.

Both speak "send one line, read until HAProxy closes". The byte transport is
pluggable (``send=``) so the SSH transport can reuse all parsing and the reload
verification through a forwarded unix socket.

Measured on HAProxy 2.6.12 (see docs in ``MasterSocket.reload_and_verify``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import socket
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from typing import Literal, NamedTuple

from apps.fleets.node.mapdelta import MapDelta, parse_get_map
from apps.fleets.node.showstat import StatRow, int_or_none, parse_show_stat

ServerState = Literal["ready", "drain", "maint"]

# `send(command, timeout_s) -> response text`. Must raise RuntimeUnavailable when the
# socket cannot be reached (the reload poller treats that as "master busy").
Sender = Callable[[str, float], str]

# HAProxy proxy/server names: letters, digits, '-', '_', '.', ':'. Anything else
# (spaces, ';', newlines) could smuggle a second command onto the CLI line.
_NAME_RE = re.compile(r"^[A-Za-z0-9_.:-]{1,128}$")
_MAX_RESPONSE_BYTES = 64 * 1024 * 1024


class RuntimeApiError(Exception):
    """HAProxy answered, but refused the command; ``message`` is HAProxy's own text."""

    def __init__(self, command: str, message: str) -> None:
        self.command = command
        self.message = message.strip()
        super().__init__(f"HAProxy refused {command!r}: {self.message}")


class RuntimeUnavailable(Exception):
    """The socket could not be reached or did not answer in time."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"HAProxy socket {path} unavailable: {reason}")


def unix_socket_sender(path: str) -> Sender:
    """A Sender over a local unix socket: connect, send one line, read to EOF."""

    def send(command: str, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.settimeout(timeout_s)
            try:
                sock.connect(path)
            except FileNotFoundError as exc:
                raise RuntimeUnavailable(path, "socket file does not exist") from exc
            except OSError as exc:
                raise RuntimeUnavailable(path, exc.strerror or str(exc)) from exc
            chunks: list[bytes] = []
            received = 0
            try:
                sock.sendall(command.encode() + b"\n")
                # The master CLI keeps the connection open for more commands until the
                # client half-closes (the stats socket closes by itself); socat does the same.
                sock.shutdown(socket.SHUT_WR)
                while True:
                    sock.settimeout(max(0.001, deadline - time.monotonic()))
                    chunk = sock.recv(65536)
                    if not chunk:
                        break
                    chunks.append(chunk)
                    received += len(chunk)
                    if received > _MAX_RESPONSE_BYTES:
                        raise RuntimeUnavailable(path, "response larger than 64 MiB")
            except TimeoutError as exc:
                raise RuntimeUnavailable(path, f"no complete answer within {timeout_s:.1f}s") from exc
            except OSError as exc:
                # The master closes the connection abruptly when it re-executes on
                # `reload`; what was read so far is all there is.
                if exc.errno not in (errno.ECONNRESET, errno.EPIPE):
                    raise RuntimeUnavailable(path, exc.strerror or str(exc)) from exc
            return b"".join(chunks).decode("utf-8", errors="replace")
        finally:
            sock.close()

    return send


_MAP_NAME_RE = re.compile(r"^maps/[A-Za-z0-9_.-]{1,200}\.map$")
_MAP_CHUNK_BYTES = 8 * 1024
_CERT_NAME_RE = re.compile(r"^certs/[A-Za-z0-9_.-]{1,200}\.pem$")
_PEM_LINE_RE = re.compile(r"^[A-Za-z0-9+/=: ,()-]{1,200}$")


def _check_cert_name(name: str) -> str:
    if not _CERT_NAME_RE.match(name):
        raise ValueError(f"invalid certificate name {name!r}: Spillway's certificates are certs/<name>.pem")
    return name


def _check_map(name: str) -> str:
    if not _MAP_NAME_RE.match(name):
        raise ValueError(f"invalid map name {name!r}: Spillway's maps are maps/<name>.map")
    return name


# HAProxy reads the CLI's lines up to its buffer size (tune.bufsize, 16 kB by default).
BATCH_BYTES = 8 * 1024


def _cli_escape(text: str) -> str:
    """A command argument as the CLI parses it: `;` separates commands and `\\` escapes, so both are escaped."""
    return text.replace("\\", "\\\\").replace(";", "\\;")


def _map_key(key: str) -> str:
    _map_line(key, "-")
    return key


def _set_answer(command: str, answer: str) -> None:
    # Set commands answer an empty line on success and a sentence on failure.
    if answer.strip():
        raise RuntimeApiError(command, answer)


def _absent_ok_answer(command: str, answer: str) -> None:
    # A key that is not there is not an error (a `del map`, or the `set map` tried before an `add map`).
    if answer.strip() and "not found" not in answer.lower():
        raise RuntimeApiError(command, answer)


def _map_line(key: str, value: str) -> str:
    # A key with whitespace would split differently; an empty line would end the payload early.
    if not key or any(c.isspace() for c in key) or "\n" in value or "\r" in value or not value.strip():
        raise ValueError(f"map entry {key!r} -> {value!r} cannot be sent over the runtime API")
    return f"{key} {value}"


def _check_name(kind: str, value: str) -> str:
    if not _NAME_RE.match(value):
        raise ValueError(f"invalid HAProxy {kind} name {value!r}: use letters, digits, '-', '_', '.', ':'")
    return value


class HAProxySocket:
    """Client for the stats socket (``level admin``). One command per connection."""

    def __init__(self, path: str, timeout_s: float = 2.0, *, send: Sender | None = None) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._send = send or unix_socket_sender(path)

    def command(self, command: str) -> str:
        """Send a raw command and return HAProxy's answer text (no error interpretation)."""
        if "\n" in command or "\r" in command:
            raise ValueError("one command per call: newlines are not allowed")
        return self._send(command, self.timeout_s)

    def _set(self, command: str) -> None:
        _set_answer(command, self.command(command))

    def show_stat(self) -> list[StatRow]:
        return parse_show_stat(self.command("show stat"))

    def show_info(self) -> dict[str, str]:
        info: dict[str, str] = {}
        for line in self.command("show info").splitlines():
            key, sep, value = line.partition(":")
            if sep:
                info[key.strip()] = value.strip()
        return info

    def set_server_state(self, backend: str, server: str, state: ServerState) -> None:
        if state not in ("ready", "drain", "maint"):
            raise ValueError(f"state must be ready, drain or maint, not {state!r}")
        self._set(f"set server {_check_name('backend', backend)}/{_check_name('server', server)} state {state}")

    def frontend_statuses(self) -> dict[str, str]:
        """{frontend: status} (OPEN, FULL, PAUSED, STOP) from the frontends' rows of `show stat` alone."""
        return {r.pxname: r.status for r in parse_show_stat(self.command("show stat -1 1 -1")) if r.type == 0}

    def enable_frontend(self, frontend: str) -> None:
        """Undo `disable frontend` (PAUSED); a frontend stopped by `shutdown frontend` refuses (reload it)."""
        self._set(f"enable frontend {_check_name('frontend', frontend)}")

    def set_server_weight(self, backend: str, server: str, weight: int) -> None:
        if not 0 <= weight <= 256:
            raise ValueError(f"weight must be 0..256, not {weight}")
        target = f"{_check_name('backend', backend)}/{_check_name('server', server)}"
        self._set(f"set server {target} weight {int(weight)}")

    def replace_map(self, name: str, entries: list[tuple[str, str]]) -> None:
        """Swap a loaded map's whole content atomically, without a reload.

        ``prepare map`` opens an empty version, ``add map @v name <<`` payloads fill it (chunked:
        a CLI payload must fit HAProxy's 16 kB buffer), ``commit map @v`` makes it live in one step,
        so requests see the old map or the new one, never a mix (measured on 2.6.12: 20,000 entries
        in 28 ms; map_beg keeps its longest-prefix lookup for entries added this way).
        """
        _check_map(name)
        lines = [_map_line(key, value) for key, value in entries]
        answer = self.command(f"prepare map {name}")
        match = re.search(r"New version created: (\d+)", answer)
        if not match:
            raise RuntimeApiError(f"prepare map {name}", answer or "empty answer")
        version = match.group(1)
        chunk: list[str] = []
        size = 0
        for line in [*lines, None]:
            if line is not None:
                chunk.append(line)
                size += len(line) + 1
            if chunk and (line is None or size >= _MAP_CHUNK_BYTES):
                command = f"add map @{version} {name} <<\n" + "\n".join(chunk) + "\n"
                answer = self._send(command, self.timeout_s)  # the sender's newline ends the payload
                if answer.strip():
                    raise RuntimeApiError(f"add map @{version} {name}", answer)
                chunk, size = [], 0
        self._set(f"commit map @{version} {name}")

    def add_map_entry(self, name: str, key: str, value: str) -> None:
        """Add one entry to the live version of a loaded map (a duplicate key adds a second entry)."""
        self._set(f"add map {_check_map(name)} {_map_line(key, value)}")

    def del_map_entry(self, name: str, key: str) -> None:
        """Remove every entry for `key`; a key that is not there is not an error."""
        command = f"del map {_check_map(name)} {_map_key(key)}"
        _absent_ok_answer(command, self.command(command))

    def map_lookup(self, name: str, key: str) -> tuple[str, str] | None:
        """The live entry `get map` matches for `key` with the map's own match (longest prefix for
        map_beg), None when none does."""
        return parse_get_map(self.command(f"get map {_check_map(name)} {_map_key(key)}"))

    def apply_map_delta(self, name: str, delta: MapDelta) -> None:
        """Add, change and remove single entries of a live map, then check each moved key with `get map`.

        New keys go in before old ones leave, so a request never falls through to a shorter prefix
        that neither the old nor the new map would give it. Raises RuntimeApiError when a key does not
        read back as intended (the caller then replaces or reloads).
        """
        _check_map(name)
        # A new key may be live already: a worker killed in the middle of applying this delta took it, and the
        # node's record still names the revision before. `add map` would add a second entry, and the first one
        # (its value possibly older) keeps answering until a reload. `set map` first sets every entry of the key
        # (a key not there answers "not found"), so the live map answers the new value either way.
        ahead = [f"set map {name} {_cli_escape(_map_line(key, value))}" for key, value in delta.added]
        moves = [f"add map {name} {_cli_escape(_map_line(key, value))}" for key, value in delta.added]
        moves += [f"set map {name} {_cli_escape(_map_line(key, value))}" for key, value in delta.changed]
        removes = [f"del map {name} {_cli_escape(_map_key(key))}" for key in delta.removed]
        wanted = (*delta.added, *delta.changed)
        reads = [f"get map {name} {_cli_escape(key)}" for key, _ in wanted]
        reads += [f"get map {name} {_cli_escape(key)}" for key in delta.removed]
        answers = self.batch([*ahead, *moves, *removes, *reads])
        for command, answer in zip(ahead, answers[:len(ahead)], strict=True):
            _absent_ok_answer(command, answer)  # "not found" is the usual answer
        answers = answers[len(ahead):]
        for command, answer in zip(moves, answers[:len(moves)], strict=True):
            _set_answer(command, answer)
        for command, answer in zip(removes, answers[len(moves):len(moves) + len(removes)], strict=True):
            _absent_ok_answer(command, answer)
        found = [parse_get_map(answer) for answer in answers[len(moves) + len(removes):]]
        for (key, value), live in zip(wanted, found[:len(wanted)], strict=True):
            if live != (key, value):
                raise RuntimeApiError(f"get map {name} {key}", f"not {value!r} after the update")
        for key, live in zip(delta.removed, found[len(wanted):], strict=True):
            if live is not None and live[0] == key:
                raise RuntimeApiError(f"get map {name} {key}", "still present after `del map`")

    def batch(self, commands: list[str]) -> list[str]:
        """Each command's answer, the commands sent `;`-separated over as few connections as fit HAProxy's line
        (BATCH_BYTES): a route change's map update and its read-back were a connection per command, each a wait
        for a busy HAProxy to accept it. Answers are told apart as HAProxy ends each: with an empty line (an
        empty answer is that empty line alone)."""
        answers: list[str] = []
        start = 0
        while start < len(commands):
            end, size = start, 0
            while end < len(commands) and (end == start or size + len(commands[end]) + 1 <= BATCH_BYTES):
                size += len(commands[end]) + 1
                end += 1
            text = self.command(";".join(commands[start:end]))
            at = 0
            for command in commands[start:end]:
                if text.startswith("\n", at):
                    answers.append("")
                    at += 1
                    continue
                stop = text.find("\n\n", at)
                if stop < 0:
                    raise RuntimeApiError(command, text[at:] or "no answer")
                answers.append(text[at:stop + 1])
                at = stop + 2
            start = end
        return answers

    def set_ssl_cert(self, name: str, pem: bytes) -> str:
        """Replace a loaded certificate (chain + key PEM) in one step, without a reload; its new serial.

        `set ssl cert` opens a transaction holding the new PEM, `commit ssl cert` swaps it in: new
        handshakes get the new certificate, established connections keep theirs (HAProxy 2.6).
        """
        _check_cert_name(name)
        lines = [line for line in pem.decode().splitlines() if line.strip()]  # a blank line ends the payload
        if not lines or any(not _PEM_LINE_RE.match(line) for line in lines):
            raise ValueError(f"{name}: not PEM text that can be sent over the runtime API")
        answer = self._send(f"set ssl cert {name} <<\n" + "\n".join(lines) + "\n", self.timeout_s)
        if "Transaction created" not in answer and "Transaction updated" not in answer:
            self.command(f"abort ssl cert {name}")
            raise RuntimeApiError(f"set ssl cert {name}", answer)
        answer = self.command(f"commit ssl cert {name}")
        if "Success" not in answer:
            self.command(f"abort ssl cert {name}")
            raise RuntimeApiError(f"commit ssl cert {name}", answer)
        return self.ssl_cert_serial(name)

    def ssl_cert_serial(self, name: str) -> str:
        """The serial (upper-case hex, as `show ssl cert` prints it) of the live certificate `name`."""
        answer = self.command(f"show ssl cert {_check_cert_name(name)}")
        match = re.search(r"^Serial: ([0-9A-F]+)$", answer, re.MULTILINE)
        if not match:
            raise RuntimeApiError(f"show ssl cert {name}", answer or "empty answer")
        return match.group(1)

    def show_map(self, name: str) -> list[tuple[str, str]]:
        """(key, value) of the live version of a loaded map, in HAProxy's order."""
        entries = []
        for line in self.show_map_lines(name):
            key, _, value = line.partition(" ")
            if not key:
                raise RuntimeApiError(f"show map {name}", line)
            entries.append((key, value))
        return entries

    def show_map_lines(self, name: str) -> list[str]:
        """The live map's entries as "key value" lines, in HAProxy's order (each entry's reference cut off).

        Without a Python step per line where C can take it: drift checks read every map of every node, 200k
        lines a node at 100k routes, and a line-by-line parse was most of their time."""
        _check_map(name)
        text = self.command(f"show map {name}")
        rows = list(filter(None, text.split("\n")))
        # Each entry starts with its reference (0x...); anything else is HAProxy refusing, e.g.
        # "Unknown map identifier. Please use #<id> or <file>." from a worker without this map,
        # which read as an entry 'map' -> 'identifier. ...' before.
        if text.count("\n0x") + text.startswith("0x") != len(rows):
            bad = next((row for row in rows if not row.startswith("0x")), text)
            raise RuntimeApiError(f"show map {name}", bad)
        return list(map(itemgetter(2), map(str.partition, rows, repeat(" "))))

    def show_servers_state(self) -> str:
        """``show servers state`` text, in the format ``server-state-file`` loads."""
        text = self.command("show servers state")
        if not text.startswith("1\n"):
            raise RuntimeApiError("show servers state", text or "empty answer")
        return text

    def dump_server_state(self, path: str) -> None:
        """Write ``show servers state`` to ``path`` atomically (temp file + fsync + rename).

        The config must name the same file in ``server-state-file`` and carry
        ``load-server-state-from-file global`` in ``defaults``; otherwise runtime weight
        and drain/maint changes are lost on the next reload.
        """
        write_file_atomic(path, self.show_servers_state().encode())


def write_file_atomic(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` so a reader sees the old or the new file, never half."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


class WorkerProc(NamedTuple):
    pid: int
    reloads: int
    uptime: str
    version: str


@dataclass(frozen=True)
class ProcInfo:
    master_pid: int
    master_reloads: int  # counts every reload the master processed, failed or not
    failed_reloads: int  # 2.6: failures since the last successful reload (reset to 0 on success)
    workers: list[WorkerProc]

    @property
    def current_worker(self) -> WorkerProc | None:
        """The worker that took the latest successful (re)load: the one with the fewest reloads."""
        return min(self.workers, key=lambda w: (w.reloads, -w.pid)) if self.workers else None


_FAILED_RE = re.compile(r"\[failed:\s*(\d+)\]")


def parse_show_proc(text: str) -> ProcInfo:
    """Parse the master's ``show proc``.

    2.6 prints::

        #<PID>          <type>          <reloads>       <uptime>        <version>
        9588            master          1 [failed: 0]   0d00h00m01s     2.6.12-1+deb12u4
        # workers
        9600            worker          0               0d00h00m00s     2.6.12-1+deb12u4
        # programs
    """
    master_pid: int | None = None
    master_reloads = 0
    failed = 0
    workers: list[WorkerProc] = []
    for line in text.splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        failed_match = _FAILED_RE.search(line)
        cleaned = _FAILED_RE.sub("", line)
        parts = cleaned.split()
        if len(parts) < 3 or not parts[0].isdigit():
            continue
        pid, kind = int(parts[0]), parts[1]
        reloads = int_or_none(parts[2]) or 0
        if kind == "master":
            master_pid, master_reloads = pid, reloads
            failed = int(failed_match.group(1)) if failed_match else 0
        elif kind == "worker":
            uptime = parts[3] if len(parts) > 3 else ""
            version = parts[4] if len(parts) > 4 else ""
            workers.append(WorkerProc(pid, reloads, uptime, version))
    if master_pid is None:
        raise ValueError(f"not a show proc answer: {text[:200]!r}")
    return ProcInfo(master_pid=master_pid, master_reloads=master_reloads, failed_reloads=failed, workers=workers)


@dataclass(frozen=True)
class ReloadResult:
    ok: bool
    new_worker_pid: int | None
    old_worker_pids: list[int]
    error: str | None
    duration_ms: float


class MasterSocket:
    """Client for the master CLI (``haproxy -W -S <path>,level,admin``)."""

    def __init__(self, path: str, timeout_s: float = 2.0, *, send: Sender | None = None) -> None:
        self.path = path
        self.timeout_s = timeout_s
        self._send = send or unix_socket_sender(path)

    def show_proc(self) -> ProcInfo:
        return parse_show_proc(self._send("show proc", self.timeout_s))

    def _show_proc_retrying(self, deadline: float, poll_s: float) -> ProcInfo:
        # The master re-executes itself on reload and its socket refuses connections
        # for that time (about 2.5 s when a bind fails), so "unavailable" means "wait".
        last_error: Exception | None = None
        while True:
            try:
                return self.show_proc()
            except (RuntimeUnavailable, ValueError) as exc:
                last_error = exc
            if time.monotonic() >= deadline:
                raise RuntimeUnavailable(self.path, f"master did not answer show proc: {last_error}")
            time.sleep(poll_s)

    def reload_and_verify(self, timeout_s: float = 10.0, poll_s: float = 0.02) -> ReloadResult:
        """Ask the master to reload and find out from ``show proc`` whether it worked.

        2.6's ``reload`` returns no status (that came in 2.7). Measured on 2.6.12:

        * success: the master's reload counter goes up and a worker PID that was not
          there before appears with 0 reloads (trivial config: 40-90 ms after the
          command). The old worker lingers with "1 reloads" until its connections end.
        * the master socket refuses connections while the master re-executes and first
          answers once the outcome is settled (the new worker is already listed), so
          the first ``show proc`` that answers after the command is conclusive.
        * failure (bad config, or a ``bind`` on a port another process holds): the
          reload counter goes up, the master line shows ``[failed: N]`` (N counts
          consecutive failures: 1, 2, 3...; a success resets it to 0) and the only
          worker is the old one, now with 1 more reload. A config error is reported
          within ~50 ms; a bind conflict takes ~2.1-2.5 s, during which the master
          socket refuses connections and the old worker *pauses its listeners*
          (no service for ~1.5 s) before resuming the old config.

        The master's own error text (ALERT lines) goes to its stderr only; it is not
        available on the 2.6 master CLI, so ``error`` says what the counters show.
        """
        start = time.monotonic()
        deadline = start + timeout_s
        before = self._show_proc_retrying(deadline, poll_s)
        before_pids = {w.pid for w in before.workers}
        # The master closes the connection without answering when it re-executes.
        with contextlib.suppress(RuntimeUnavailable):
            self._send("reload", min(self.timeout_s, max(0.05, deadline - time.monotonic())))

        def result(ok: bool, new_pid: int | None, error: str | None) -> ReloadResult:
            return ReloadResult(
                ok=ok,
                new_worker_pid=new_pid,
                old_worker_pids=sorted(before_pids),
                error=error,
                duration_ms=(time.monotonic() - start) * 1000.0,
            )

        while True:
            try:
                after = self._show_proc_retrying(deadline, poll_s)
            except RuntimeUnavailable as exc:
                return result(False, None, f"reload not confirmed within {timeout_s:.1f}s: {exc}")
            if after.master_pid != before.master_pid:
                return result(
                    False,
                    None,
                    f"master PID changed from {before.master_pid} to {after.master_pid} (restarted?)",
                )
            if after.master_reloads > before.master_reloads:
                fresh = [w for w in after.workers if w.pid not in before_pids and w.reloads == 0]
                if fresh:
                    return result(True, max(w.pid for w in fresh), None)
                if after.failed_reloads > 0:
                    survivors = sorted(w.pid for w in after.workers)
                    return result(
                        False,
                        None,
                        f"HAProxy rejected the reload ([failed: {after.failed_reloads}] on the master); "
                        f"worker(s) {survivors} keep serving the previous config. The reason is in the "
                        "master's stderr: typically a config error or a bind address held by another process",
                    )
            if time.monotonic() >= deadline:
                return result(False, None, f"no new worker within {timeout_s:.1f}s of the reload command")
            time.sleep(poll_s)


# `show servers state` srv_admin_state bits: FMAINT, IMAINT, CMAINT; FDRAIN, IDRAIN.
_MAINT_BITS = 0x01 | 0x02 | 0x04
_DRAIN_BITS = 0x08 | 0x10


def parse_servers_state(text: str) -> dict[tuple[str, str], tuple[str, int]]:
    """{(backend, server): (admin state, user weight)} from `show servers state` (format version 1)."""
    out = {}
    for line in text.splitlines()[1:]:
        if not line or line.startswith("#"):
            continue
        cols = line.split()
        admin, weight = int(cols[6]), int(cols[7])
        state = "maint" if admin & _MAINT_BITS else "drain" if admin & _DRAIN_BITS else "active"
        out[(cols[1], cols[3])] = (state, weight)
    return out
