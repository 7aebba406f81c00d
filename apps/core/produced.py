"""The LB revisions a request's writes produced, so its answer can say them (no second, racy GET).

`lb_touch` records each revision it makes; the API's base views start a collection for each request and put
what it holds into a write's answer: the `Spillway-LB-Revision` header (`<revision>` for one load balancer,
`<lb id>=<revision>, ...` for several) and, in a JSON object body, `lb_revision` (or `lb_revisions`). A
pipeline waits on exactly that revision with `GET /api/v1/load-balancers/{id}/applied/?revision=N`.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import Any

HEADER = "Spillway-LB-Revision"
_revisions: ContextVar[dict[int, int] | None] = ContextVar("spillway_produced_revisions", default=None)


def start() -> None:
    _revisions.set({})


def record(lb_id: int, revision: int) -> None:
    found = _revisions.get()
    if found is not None:
        found[lb_id] = max(revision, found.get(lb_id, 0))


def take() -> dict[int, int]:
    found = _revisions.get() or {}
    _revisions.set(None)
    return found


def stamp(response: Any, revisions: dict[int, int]) -> None:
    """Put `revisions` on a successful write's DRF response (header always, body when it is an object)."""
    if not revisions or not 200 <= response.status_code < 300:
        return
    if len(revisions) == 1:
        response[HEADER] = str(next(iter(revisions.values())))
    else:
        response[HEADER] = ", ".join(f"{lb}={rev}" for lb, rev in sorted(revisions.items()))
    data = getattr(response, "data", None)
    if isinstance(data, dict):
        if len(revisions) == 1:
            data["lb_revision"] = next(iter(revisions.values()))
        else:
            data["lb_revisions"] = {str(lb): rev for lb, rev in sorted(revisions.items())}
