"""Periodic fleet tasks: converge (drift, returning nodes, missed changes) and health collection."""

from __future__ import annotations

CONVERGE_EVERY_S = 10.0
HEALTH_EVERY_S = 5.0
ENFORCE_EVERY_S = 1.0  # per-node overflow shares follow where demand arrives


def register(app) -> None:
    app.add_periodic_task(CONVERGE_EVERY_S, app.signature("fleets.converge_task"), name="fleets-converge")
    app.add_periodic_task(HEALTH_EVERY_S, app.signature("fleets.health_task"), name="fleets-health")
    app.add_periodic_task(ENFORCE_EVERY_S, app.signature("fleets.enforce_task", expires=ENFORCE_EVERY_S),
                          name="fleets-enforce")
