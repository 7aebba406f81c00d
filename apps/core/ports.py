"""Which local TCP ports are taken, and by whom (so `make run` can say it instead of half-starting)."""

from __future__ import annotations

import re
import shutil
import socket
import subprocess

_USERS = re.compile(r'\("([^"]+)",pid=(\d+)')


def is_free(address: str, port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # TIME_WAIT leftovers do not count
        try:
            probe.bind((address, port))
        except OSError:
            return False
    return True


def holder(address: str, port: int) -> str:
    """'haproxy (pid 123)' for a listening socket on address:port, as far as `ss` can tell."""
    if shutil.which("ss") is None:
        return "another process"
    try:
        out = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, timeout=5).stdout
    except (OSError, subprocess.SubprocessError):
        return "another process"
    for line in out.splitlines():
        fields = line.split()
        local = fields[3] if len(fields) > 3 else ""
        if local.rsplit(":", 1)[0].strip("[]") in (address, "0.0.0.0", "*", "::"):
            users = _USERS.findall(line)
            if users:
                return ", ".join(f"{name} (pid {pid})" for name, pid in dict.fromkeys(users))
    return "another process"


def taken(addresses: list[tuple[str, int]]) -> list[str]:
    """'127.0.0.1:8000 held by gunicorn (pid 9)' for every address:port that cannot be bound."""
    return [f"{a}:{p} held by {holder(a, p)}" for a, p in addresses if not is_free(a, p)]
