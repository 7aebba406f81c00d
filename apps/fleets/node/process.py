"""Start and stop a local HAProxy master (demo fleet, tests, benchmarks).

The master runs in the foreground (``-W`` without ``-D``) under our Popen: with ``-D``
the master's startup errors are lost. Its stdout/stderr go to
``<runtime_dir>/haproxy.log`` (a file, not a pipe, so a chatty master can never block
on a full pipe nobody reads); that log is also the only place 2.6 writes why a reload
failed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

from apps.fleets.node.runtime_api import MasterSocket, RuntimeUnavailable

MASTER_SOCKET_NAME = "master.sock"
LOG_NAME = "haproxy.log"  # transports read reload failure reasons from here


class MasterStartError(RuntimeError):
    """HAProxy exited or never answered on its master socket; carries the log tail."""


def master_socket_path(runtime_dir: str | os.PathLike[str]) -> str:
    return str(Path(runtime_dir) / MASTER_SOCKET_NAME)


def log_tail(runtime_dir: str | os.PathLike[str], max_bytes: int = 4000) -> str:
    path = Path(runtime_dir) / LOG_NAME
    try:
        with path.open("rb") as handle:
            handle.seek(0, os.SEEK_END)
            handle.seek(max(0, handle.tell() - max_bytes))
            return handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""


def start_master(
    cfg_path: str | os.PathLike[str],
    runtime_dir: str | os.PathLike[str],
    haproxy_bin: str = "haproxy",
    timeout_s: float = 10.0,
) -> subprocess.Popen[bytes]:
    """Start ``haproxy -W -S <runtime_dir>/master.sock,mode,600,level,admin -f cfg``.

    Returns once the master socket answers ``show proc`` with at least one worker.
    The process gets its own session so a Ctrl-C in the caller's terminal does not
    reach it, and so ``stop_master`` can clean up its process group by that id.
    On failure the master is stopped and MasterStartError carries the log tail.
    """
    runtime = Path(runtime_dir)
    runtime.mkdir(parents=True, exist_ok=True)
    sock_path = master_socket_path(runtime)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(sock_path)  # a stale socket file would make the wait below lie
    # The master re-executes itself on reload with the same argv, so the config path
    # must stay valid across reloads: callers pass the stable `current/haproxy.cfg`.
    argv = [haproxy_bin, "-W", "-S", f"{sock_path},mode,600,level,admin", "-f", str(cfg_path)]
    log = (runtime / LOG_NAME).open("ab")
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=str(runtime),
            start_new_session=True,
        )
    finally:
        log.close()
    master = MasterSocket(sock_path, timeout_s=1.0)
    deadline = time.monotonic() + timeout_s
    while True:
        code = proc.poll()
        if code is not None:
            raise MasterStartError(f"haproxy exited with code {code} at startup:\n{log_tail(runtime)}")
        try:
            if master.show_proc().workers:
                return proc
        except (RuntimeUnavailable, ValueError):
            pass
        if time.monotonic() >= deadline:
            stop_master(proc)
            raise MasterStartError(
                f"haproxy master socket {sock_path} did not answer within {timeout_s:.1f}s:\n{log_tail(runtime)}"
            )
        time.sleep(0.02)


def _wait(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        proc.wait(timeout=timeout_s)
        return True
    except subprocess.TimeoutExpired:
        return False


def stop_master(proc: subprocess.Popen[bytes], soft_timeout_s: float = 3.0, term_timeout_s: float = 2.0) -> int | None:
    """Stop a master started by ``start_master``, by its PID; returns its exit code.

    SIGUSR1 (soft stop: workers finish their connections, then the master exits),
    then SIGTERM (hard stop), then SIGKILL. The SIGKILL goes to the process group
    whose id is the master's own PID (``start_new_session``), so workers of a killed
    master cannot linger; nothing outside the group we created is touched.
    """
    if proc.poll() is None:
        for sig, timeout_s in ((signal.SIGUSR1, soft_timeout_s), (signal.SIGTERM, term_timeout_s)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, sig)
            if _wait(proc, timeout_s):
                break
        else:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            _wait(proc, 5.0)
    # Workers exit on their own when the master is gone; reap any that a soft stop left
    # behind in our group (the group id is the master's PID, created by us).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, 0)
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.02)
        else:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode
