"""tests/netutil.py: the ports tests bind later come from below the kernel's ephemeral range."""

from __future__ import annotations

import socket

from tests.netutil import _ephemeral_low, pick_free_port


def test_a_picked_port_is_free_and_never_one_an_outgoing_connection_could_take() -> None:
    low = _ephemeral_low()
    ports = {pick_free_port() for _ in range(20)}
    assert all(1024 <= port < low for port in ports)
    assert len(ports) > 1  # random, so parallel workers do not pick alike
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))  # still free
