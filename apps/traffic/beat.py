"""Periodic traffic tasks: observation (as often as fleets collect health), rollups, retention."""

from __future__ import annotations

OBSERVE_EVERY_S = 5.0  # fleets collect `show stat` every 5 s
CAPACITY_WATCH_EVERY_S = 5.0
ROLLUP_EVERY_S = 60.0
PRUNE_EVERY_S = 600.0


def register(app) -> None:
    app.add_periodic_task(OBSERVE_EVERY_S, app.signature("traffic.observe_task"), name="traffic-observe")
    app.add_periodic_task(CAPACITY_WATCH_EVERY_S, app.signature("traffic.capacity_watch_task"),
                          name="traffic-capacity-watch")
    app.add_periodic_task(ROLLUP_EVERY_S, app.signature("traffic.rollup_task"), name="traffic-rollup")
    app.add_periodic_task(PRUNE_EVERY_S, app.signature("traffic.prune_task"), name="traffic-prune")
