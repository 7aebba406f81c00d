"""Check a rendered bundle with the real HAProxy binary, and pre-check bind addresses before a push.

No Django. `validate_bundle` is the gate every revision passes before it reaches a node (DESIGN.md
principle 2); its output is stored with the revision, so it keeps every line HAProxy printed.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from apps.fleets.config.render.sections import SERVER_STATE_FILE
from apps.fleets.config.spec import MAIN_FILE, ConfigBundle

VALIDATE_TIMEOUT_S = 120
SERVER_STATE_VERSION_LINE = b"1\n"  # an empty state file: without it `-c -dW` fails on a warning


@dataclass(frozen=True)
class ValidationResult:
    ok: bool
    output: str  # HAProxy's stdout + stderr, ALERT/WARNING lines included
    duration_ms: float


def write_bundle(bundle: ConfigBundle, directory: str | Path) -> list[Path]:
    """Write every file of the bundle under `directory`; certificates (private keys) get mode 0600."""
    root = Path(directory)
    written = []
    for name, content in bundle.files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o600 if bundle.is_secret(name) else 0o644
        # Create with the final mode so a key is never readable by others, even for a moment.
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(content)
        os.chmod(path, mode)
        written.append(path)
    return written


def relocate_main(bundle: ConfigBundle, scratch_dir: str) -> str:
    """haproxy.cfg with its runtime files moved into scratch_dir.

    Maps and certificates are relative to the config's directory (`default-path config`), so a copy
    of the bundle resolves them by itself. The node's runtime_dir appears only in the lines the render
    manifest names (stats socket, server-state-file); `-c` reads the state file, so those lines, and
    nothing else (a route path could contain the same text), are pointed at the scratch directory.
    """
    facts = bundle.rendered_manifest
    lines = bundle.body.split("\n")
    for number in facts.runtime_lines:
        lines[number] = lines[number].replace(facts.runtime_dir, scratch_dir, 1)
    return bundle.main[: facts.header_len] + "\n".join(lines)


def validate_bundle(bundle: ConfigBundle, haproxy_bin: str = "haproxy") -> ValidationResult:
    """Run `haproxy -c -dW` on a scratch copy of the bundle. Never `-q`: the ALERT lines are the point.

    `-dW` turns warnings into errors: HAProxy only warns about some directive-injection shapes.
    """
    started = time.monotonic()
    binary = shutil.which(haproxy_bin)
    if binary is None:
        return ValidationResult(False, f"haproxy binary {haproxy_bin!r} not found", 0.0)
    with tempfile.TemporaryDirectory(prefix="spillway-validate-") as scratch:
        write_bundle(bundle, scratch)
        runtime_dir = bundle.rendered_manifest.runtime_dir
        Path(scratch, MAIN_FILE).write_text(relocate_main(bundle, scratch))
        Path(scratch, SERVER_STATE_FILE).write_bytes(SERVER_STATE_VERSION_LINE)
        try:
            proc = subprocess.run(
                [binary, "-c", "-dW", "-f", MAIN_FILE],
                cwd=scratch,
                capture_output=True,
                text=True,
                timeout=VALIDATE_TIMEOUT_S,
                check=False,
            )
            ok, output = proc.returncode == 0, proc.stdout + proc.stderr
        except subprocess.TimeoutExpired as exc:
            ok, output = False, f"haproxy -c timed out after {exc.timeout}s"
        # Show the node's paths, not the scratch directory's, in stored output.
        output = output.replace(scratch, runtime_dir)
    return ValidationResult(ok, output, (time.monotonic() - started) * 1000.0)


# --- bind pre-check -------------------------------------------------------------------------------

_TCP_LISTEN = "0A"


# The kernel lists each task's children (CONFIG_PROC_CHILDREN): a process's descendants are then found by walking
# down from it, not by reading the stat of every process on the host.
_CHILDREN_LISTED = os.path.exists(f"/proc/self/task/{os.getpid()}/children")


def descendants(pids: set[int]) -> set[int]:
    """The given pids and all their descendants (HAProxy workers are children of the master).

    Walked down through /proc/<pid>/task/*/children where the kernel has it: reading every process's stat instead
    cost each local node's pre-check one read per process on the host, and with /proc/net/tcp read again per node
    (HostListeners), a rollout's pre-check of 200 local nodes (~600 processes) spent 85% of its 26 s there."""
    table = None if _CHILDREN_LISTED else _children_by_scan()
    found, todo = set(), list(pids)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(_children(pid) if table is None else table.get(pid, ()))
    return found


def _children(pid: int) -> list[int]:
    """pid's children, from each of its threads' list (a child is listed under the thread that forked it)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []  # gone
    children = []
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as listing:
                children.extend(int(child) for child in listing.read().split())
        except OSError:
            continue  # the thread ended meanwhile
    return children


def _children_by_scan() -> dict[int, list[int]]:
    """{pid: its children} from every process's stat (a kernel without the children lists)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    return children


def _socket_inodes(pids: set[int]) -> set[int]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(int(target[8:-1]))
    return inodes


def _parse_proc_address(hex_address: str) -> tuple[str, int]:
    addr_hex, port_hex = hex_address.split(":")
    raw = bytes.fromhex(addr_hex)
    # /proc prints the address as host-order 32-bit words.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    family = socket.AF_INET if len(raw) == 4 else socket.AF_INET6
    return socket.inet_ntop(family, words), int(port_hex, 16)


def _listeners() -> dict[int, list[tuple[str, int]]]:
    """port -> (address, socket inode) of every LISTEN socket on this host, from /proc/net/tcp{,6}.

    Read once per check: the tables list every TCP socket (a busy host's TIME_WAIT connections too), and
    reading them again for each address made the pre-check's cost grow with addresses x connections.
    """
    by_port: dict[int, list[tuple[str, int]]] = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != _TCP_LISTEN:
                continue
            local, local_port = _parse_proc_address(fields[1])
            if local.startswith("::ffff:"):
                local = local[7:]
            by_port.setdefault(local_port, []).append((local, int(fields[9])))
    return by_port


class HostListeners:
    """This host's LISTEN sockets (_listeners), read at the first question and kept for one round of pre-checks:
    a rollout checks every local node's new binds before it touches any, and each node reading /proc/net/tcp{,6}
    again made the round grow with nodes x sockets. The rollout pushes nothing during the round, but other
    processes (another fleet's rollout, a stranger) may start or stop listening: bind_conflicts confirms a conflict
    the table shows with a fresh read, and a stranger that starts meanwhile is found by the probe bind unless it set
    SO_REUSEPORT, as one that started after a per-node read always could be."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._table: dict[int, list[tuple[str, int]]] | None = None

    def table(self) -> dict[int, list[tuple[str, int]]]:
        with self._lock:
            if self._table is None:
                self._table = _listeners()
            return self._table


def _listening_inodes(listeners: dict[int, list[tuple[str, int]]], address: str, port: int) -> set[int]:
    """Inodes of LISTEN sockets that block a bind on address:port (same address or a wildcard)."""
    wildcards = {"0.0.0.0", "::"}
    return {inode for local, inode in listeners.get(port, ())
            if local == address or local in wildcards or address in wildcards}


def _bind_error(address: str, port: int) -> int | None:
    """errno of a bind with HAProxy's own socket options, or None when it would succeed."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            probe.bind((address, port))
        except OSError as exc:
            return exc.errno
    return None


def bind_conflicts(addresses: list[tuple[str, int]], owned_by_pids: set[int],
                   host: HostListeners | None = None) -> list[tuple[str, int]]:
    """Which of `addresses` HAProxy could not bind on this host, or would share with a stranger.

    HAProxy binds with SO_REUSEADDR and SO_REUSEPORT. So a plain probe bind is not enough: a stranger
    that also set SO_REUSEPORT (same user) lets the bind succeed and then silently receives part of
    the connections, and `haproxy -c` never binds at all. Hence two checks:
    1. listening sockets: every LISTEN socket on the address (or a wildcard address) on that port,
       from /proc/net/tcp{,6}, must belong to `owned_by_pids` or a descendant of one (pass the fleet's
       HAProxy master pids; listeners live in their worker children), matched by socket inode via
       /proc/<pid>/fd. Any other holder is a conflict.
    2. nothing listens: a probe bind with HAProxy's options must succeed. It fails, as HAProxy does
       (measured on 2.6), on a socket bound without listening, on TIME_WAIT connections left by a
       server that did not set SO_REUSEADDR, and on an address this host does not have.
    A privileged port refusing an unprivileged probe (EACCES) is not reported: HAProxy starts as root.
    `host`: the listening sockets as read once for a round of checks (by default read now); a conflict found in
    that table is confirmed with a fresh read, so a holder that has exited since is no conflict.
    """
    owned_inodes = _socket_inodes(descendants(set(owned_by_pids))) if owned_by_pids else set()
    conflicts = _conflicts(addresses, owned_inodes, host.table() if host is not None else _listeners())
    if conflicts and host is not None:
        conflicts = _conflicts(conflicts, owned_inodes, _listeners())
    return conflicts


def _conflicts(addresses: list[tuple[str, int]], owned_inodes: set[int],
               listeners: dict[int, list[tuple[str, int]]]) -> list[tuple[str, int]]:
    conflicts = []
    for address, port in sorted(set(addresses)):
        holders = _listening_inodes(listeners, address, port)
        if holders:
            if not holders <= owned_inodes:
                conflicts.append((address, port))
            continue
        error = _bind_error(address, port)
        if error is not None and error != errno.EACCES:
            conflicts.append((address, port))
    return conflicts


def parse_ss_listeners(text: str) -> list[tuple[str, int, frozenset[int]]]:
    """(address, port, holder pids) of each listening TCP socket in `ss -ltnpH` output.

    `*` and `[::]` mean every address; `127.0.0.53%lo` names an interface after `%`. A socket whose
    holders `ss` may not show (another user's, without root) comes with no pids.
    """
    listeners = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 5 or fields[0] != "LISTEN":
            continue
        address, _, port = fields[3].rpartition(":")
        if not port.isdigit():
            continue
        address = address.strip("[]").split("%")[0]
        pids = frozenset(int(p) for p in re.findall(r"pid=(\d+)", " ".join(fields[5:])))
        listeners.append(("0.0.0.0" if address == "*" else address, int(port), pids))
    return listeners


def remote_bind_conflicts(addresses: list[tuple[str, int]], listeners: list[tuple[str, int, frozenset[int]]],
                          owned_by_pids: set[int]) -> list[tuple[str, int]]:
    """Which of `addresses` a socket held by anyone but `owned_by_pids` already listens on.

    For nodes reached over SSH, from `ss -ltnpH` run there: the node's own HAProxy (master and
    workers, from `show proc`) may hold an address, any other process is a conflict, and so is a
    listener whose holder `ss` could not name.
    """
    wildcards = {"0.0.0.0", "::"}
    conflicts = []
    for address, port in sorted(set(addresses)):
        for held, held_port, pids in listeners:
            same = held == address or held in wildcards or address in wildcards
            if held_port == port and same and not (pids and pids <= owned_by_pids):
                conflicts.append((address, port))
                break
    return conflicts
