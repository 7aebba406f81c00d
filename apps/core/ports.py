"""Which local TCP ports are taken, and by whom (so `make run` can say it instead of half-starting)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
from pathlib import Path

_USERS = re.compile(r'\("([^"]+)",pid=(\d+)')


def is_free(address: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def describe(pid: int) -> str:
    """A process as a person would name it: 'gunicorn', 'celery', 'manage.py runall', 'haproxy' (from its
    command line: `python -m gunicorn ...` is gunicorn, not python)."""
    try:
        argv = [a.decode(errors="replace") for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return ""
    if not argv:
        return ""
    name = Path(argv[0]).name
    if name.startswith("python") and len(argv) > 2 and argv[1] == "-m":
        return argv[2]
    if name.startswith("python") and len(argv) > 1 and argv[1].endswith(".py"):
        return " ".join([Path(argv[1]).name, *argv[2:3]])
    return name


def runall_of(pid: int) -> int | None:
    """The `manage.py runall` (what `make run` starts) that pid runs under, if any: the one to stop."""
    for _ in range(16):  # a few generations up at most (runall -> gunicorn master -> worker)
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return None
        if b"manage.py runall" in cmdline:
            return pid
        if ppid <= 1:
            return None
        pid = ppid
    return None


def _ss(port: int) -> str:
    """`ss`'s listening sockets on port, with their processes ('' when ss is missing or fails)."""
    if shutil.which("ss") is None:
        return ""
    try:
        return subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def holder(address: str, port: int) -> str:
    """'haproxy (pid 123)' for a listening socket on address:port, as far as `ss` can tell."""
    for line in _ss(port).splitlines():
        fields = line.split()
        local = fields[3] if len(fields) > 3 else ""
        if local.rsplit(":", 1)[0].strip("[]") in (address, "0.0.0.0", "*", "::"):
            users = _USERS.findall(line)
            if users:
                return ", ".join(f"{describe(int(pid)) or name} (pid {pid})" for name, pid in dict.fromkeys(users))
    return "another process"


def taken(addresses: list[tuple[str, int]]) -> list[str]:
    """'127.0.0.1:8000 held by gunicorn (pid 9)' for every address:port that cannot be bound."""
    return [f"{a}:{p} held by {holder(a, p)}" for a, p in addresses if not is_free(a, p)]


def runall_holding(port: int) -> int | None:
    """The pid of the `manage.py runall` whose process listens on port, if one does."""
    for _name, pid in _USERS.findall(_ss(port)):
        found = runall_of(int(pid))
        if found is not None:
            return found
    return None
