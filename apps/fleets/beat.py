"""Periodic fleet tasks: converge (drift, returning nodes, missed changes) and health collection."""

from __future__ import annotations

CONVERGE_EVERY_S = 10.0
HEALTH_EVERY_S = 5.0


def register(app) -> None:
    app.add_periodic_task(CONVERGE_EVERY_S, app.signature("fleets.converge_task"), name="fleets-converge")
    app.add_periodic_task(HEALTH_EVERY_S, app.signature("fleets.health_task"), name="fleets-health")
