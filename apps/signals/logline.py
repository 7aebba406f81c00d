"""One request-log line as HAProxy sends it (apps.fleets.config.render.sections.SIGNALS_LOG_FORMAT). Pure.

Who answered: HAProxy's termination state (`%tsc`, 4 characters) starts with `-` when the session ended
normally, which for an HTTP request means the response came from the server; `S` (server error or refusal),
`s` (server timeout), `P` (proxy: deny), `L` (local: return/redirect), `R` (resource), `I` (internal), `D`
(down) and `K` (killed) mean HAProxy itself ended it. `C`/`c` mean the client aborted or timed out: the status
logged is still the server's when it had answered (a backend's 500 the client did not wait to read is the
backend's 500). A 5xx that HAProxy made (no server left, connect refused, a timeout) is therefore told apart
from a 5xx the backend sent.
"""

from __future__ import annotations

from dataclasses import dataclass

from apps.fleets.config.render.sections import SIGNALS_LOG_FIELDS, SIGNALS_LOG_VERSION

NO_SERVER = "<NOSRV>"
_VERSION = SIGNALS_LOG_VERSION.encode()
_FIELDS = len(SIGNALS_LOG_FIELDS)


@dataclass(slots=True)
class Request:
    node: str  # "fleet/node"
    frontend: str  # "fe_<lb>.<listener>" (without the `~` HAProxy adds for TLS)
    backend: str
    server: str | None  # None: HAProxy answered itself (no route, redirect, deny, no server)
    status: int  # -1: no response (the client went away first)
    t_queue: int  # ms; -1: never reached this stage
    t_connect: int
    t_upstream: int  # to the server's response headers (time to first byte from the backend)
    t_total: int
    retries: int
    redispatched: bool
    termination: str
    bytes: int
    path: str
    host: str

    @property
    def by_proxy(self) -> bool:
        """HAProxy ended the request itself (see the module's docstring)."""
        return not self.termination.startswith(("-", "C", "c"))


# A line is data from the network: numbers are clamped to what a request can carry (a stored sum must not
# overflow a column), names to what the database keeps.
_MAX_INT = 2**31 - 1
_MAX_NAME = 128


def _int(value: str) -> int:
    if not value.isascii() or len(value) > 12:
        return -1
    try:
        return min(int(value), _MAX_INT)
    except ValueError:
        return -1


def parse(line: bytes) -> Request | None:
    """The request a line describes; None for anything else (another version, a truncated or foreign line)."""
    if not line.startswith(_VERSION):
        return None
    text = line.decode("utf-8", "replace").rstrip("\r\n\0")
    parts = text.split(" ", _FIELDS - 1)
    if len(parts) == _FIELDS - 1:  # cut by the node's `len` inside the path: still a request, its host unknown
        parts.append("")
    if len(parts) != _FIELDS or parts[0] != SIGNALS_LOG_VERSION:
        return None
    (_, node, frontend, backend, server, status, t_queue, t_connect, t_upstream, t_total, retries,
     termination, size, path, host) = parts
    if len(node) > _MAX_NAME or len(frontend) > _MAX_NAME or len(backend) > _MAX_NAME or len(server) > _MAX_NAME:
        return None
    redispatched = retries.startswith("+")
    return Request(
        node=node, frontend=frontend.rstrip("~"), backend=backend,
        server=None if server == NO_SERVER else server, status=_int(status),
        t_queue=_int(t_queue), t_connect=_int(t_connect), t_upstream=_int(t_upstream), t_total=_int(t_total),
        retries=max(0, _int(retries.lstrip("+"))), redispatched=redispatched, termination=termination,
        bytes=max(0, _int(size)), path=path, host=host,
    )
