"""`make run` (manage.py runall) refuses to start over a running one and names what holds the ports."""

from __future__ import annotations

import os
import socket

import pytest
from django.core.management import CommandError, call_command

from apps.core import ports
from apps.fleets import demo


def test_a_taken_port_is_reported_with_the_process_holding_it() -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert not ports.is_free("127.0.0.1", port)
        assert ports.taken([("127.0.0.1", port)])[0].endswith(f" (pid {os.getpid()})")
        expected = rf"cannot start: 127.0.0.1:{port} held by python\S* \(pid {os.getpid()}\)\. Is `make run` already"
        with pytest.raises(CommandError, match=expected):
            call_command("runall", "--bind", f"127.0.0.1:{port}")
    assert ports.is_free("127.0.0.1", port)


def test_a_taken_demo_address_stops_the_start_naming_it(monkeypatch, settings, tmp_path) -> None:
    settings.VAR_DIR = tmp_path  # the leftover clean-up reads the demo's pid file under VAR_DIR
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        with socket.socket() as web:
            web.bind(("127.0.0.1", 0))
            free_web = web.getsockname()[1]
        monkeypatch.setattr(demo, "demo_addresses", lambda: [("127.0.0.1", port)])
        with pytest.raises(CommandError, match=rf"demo fleet, its addresses are taken:\n  127.0.0.1:{port} held by "
                                               rf"python\S* \(pid {os.getpid()}\)"):
            call_command("runall", "--bind", f"127.0.0.1:{free_web}")
