"""A Python that has imported the control plane once and forks the suite's workers and commands from there.

A cold `python -m celery -A controlplane worker` spends ~1 s of CPU importing Django, Celery and the apps before it
takes a task (measured 2026-11-27 on this machine kind), and the suite starts ~45 of them, besides dispatchers, beats
and collectors, while other tests wait for the cores. Forked from this process, a worker starts with those imports
done and runs the same command line (`-m celery ...` or `manage.py ...`) under the caller's environment. A server
serves one environment (but for variables read when used, tests/processes.start_python): settings are read at
import, so a process under another environment comes from another server, or starts cold.

Nothing here may open a connection before forking (the children would share its socket): the server checks
that Django has none once it has imported everything.

Protocol, one JSON object a line on stdin, one answer a line on stdout:
  {"spawn": ["-m", "celery", ...] | ["manage.py", ...], "env": {...}, "log": path, "cwd": dir}  ->  {"pid": n}
  {"status": pid}  ->  {"returncode": null (running) | n, as Popen's: negative for a signal}
EOF on stdin ends the server (its workers keep running: they are stopped by PID).
"""

from __future__ import annotations

import atexit
import gc
import json
import logging
import os
import signal
import sys
import traceback

_exited: dict[int, int] = {}  # pid -> returncode, for children reaped before anyone asked


def _reap(signum: int | None = None, frame: object = None) -> None:
    while True:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        _exited[pid] = os.waitstatus_to_exitcode(status)


def _preload() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    import django

    django.setup()
    # What a worker imports on its way to "ready." (celery's CLI, the worker and its pools, the Redis transport).
    import celery.apps.worker
    import celery.bin.celery
    import celery.bin.worker
    import celery.concurrency.prefork
    import celery.concurrency.solo
    import celery.concurrency.thread
    import celery.worker.consumer
    import celery.worker.worker  # noqa: F401
    import kombu.transport.redis  # noqa: F401
    from django.db import connections

    from controlplane.celery import app

    app.loader.import_default_modules()
    opened = [alias for alias in connections if connections[alias].connection is not None]
    if opened:
        raise RuntimeError(f"the fork server opened database connections {opened}: its children would share them")
    # What every child inherits, out of the collector's reach (Python's advice for fork without exec): a worker's
    # own startup freeze (apps.core.gcpause.freeze_startup_heap) then collects only what it built after the fork,
    # instead of walking the ~170k inherited objects again (~155 ms of CPU per child idle, up to 270 ms busy),
    # and no collection writes to the pages a child shares with this process.
    gc.collect()
    gc.freeze()


def _run_child(argv: list[str], env: dict[str, str], log: str, cwd: str) -> None:
    """In the forked child: become `python <argv>` with its output in `log`; never return to the server loop."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the worker's pool reaps its own children
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
        out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(out, 1)
        os.dup2(out, 2)
        os.close(out)
        os.close(null)
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        if argv[:2] == ["-m", "celery"]:
            sys.argv = ["celery", *argv[2:]]
            from celery.__main__ import main

            main()
        else:  # manage.py <command>
            sys.argv = argv
            from django.core.management import execute_from_command_line

            execute_from_command_line(argv)
        code = 0
    except SystemExit as exit_:
        code = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # the child reports whatever ended it, in its log
        traceback.print_exc()
    finally:
        try:
            atexit._run_exitfuncs()  # what a cold process runs at exit (logging's flush among them)
            logging.shutdown()
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


def main() -> None:
    _preload()
    signal.signal(signal.SIGCHLD, _reap)
    out = sys.stdout
    out.write(json.dumps({"ready": os.getpid()}) + "\n")
    out.flush()
    for line in sys.stdin:
        request = json.loads(line)
        if "spawn" in request:
            sys.stdout.flush()
            sys.stderr.flush()
            # Held until the PID is known here: a status stored under it is an earlier child's (PIDs come round).
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGCHLD})
            pid = os.fork()
            if pid == 0:
                _run_child(request["spawn"], request["env"], request["log"], request["cwd"])
            _exited.pop(pid, None)
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGCHLD})
            answer = {"pid": pid}
        else:
            _reap()
            answer = {"returncode": _exited.get(int(request["status"]))}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
