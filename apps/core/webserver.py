"""The one web server command line: `make run` (manage.py runall), the benchmarks and the README's
production command all serve controlplane.asgi this way."""

from __future__ import annotations

import sys
from typing import Any

# The request environ key authentication sets to the tenant a request's credential proved ("org:<id>"): the web
# server queues that credential's later requests in the tenant's turn (controlplane.fairturns). Clients cannot
# set it: their headers only ever become HTTP_* keys.
TENANT_ENVIRON = "spillway.tenant"


def mark_tenant(meta: dict[str, Any], org_id: int) -> None:
    meta[TENANT_ENVIRON] = f"org:{org_id}"


def gunicorn_command(bind: str, workers: int = 2) -> list[str]:
    """gunicorn's native asyncio worker running controlplane.asgi: WEB_THREADS request threads per
    process (settings) and long-polls parked without a thread (see controlplane/asgi.py)."""
    return [sys.executable, "-m", "gunicorn", "controlplane.asgi:application", "-k", "asgi", "--bind", bind,
            "--workers", str(workers), "--timeout", "120", "--graceful-timeout", "5"]
