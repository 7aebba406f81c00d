"""The renderer tests' `backend` fixture (tests/fleets/config/renderkit.py starts the servers)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from http.server import ThreadingHTTPServer

import pytest

from tests.fleets.config.renderkit import Backend, start_backend


@pytest.fixture
def backend() -> Iterator[Callable[[str], Backend]]:
    """``backend(name) -> Backend``: HTTP server on 127.0.0.1 answering 200 with its name."""
    servers: list[ThreadingHTTPServer] = []

    def start(name: str) -> Backend:
        found, server = start_backend(name)
        servers.append(server)
        return found

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()
