"""The stop flag of a long-running command (runall, dispatcher, enforcer)."""

from __future__ import annotations

import signal
import threading


def stop_on_signals() -> threading.Event:
    """An event set by SIGTERM or SIGINT; the loop waits on it so a stop needs no full sleep to land."""
    stopping = threading.Event()

    def stop(*_: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    return stopping
