"""Periodic traffic tasks: rollups and retention (samples and capacity come from the fleets collector)."""

from __future__ import annotations

ROLLUP_EVERY_S = 60.0
PRUNE_EVERY_S = 600.0


def register(app) -> None:
    app.add_periodic_task(ROLLUP_EVERY_S, app.signature("traffic.rollup_task"), name="traffic-rollup")
    app.add_periodic_task(PRUNE_EVERY_S, app.signature("traffic.prune_task"), name="traffic-prune")
