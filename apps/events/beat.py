"""Periodic task: the delivery sweeper (lost messages, claims of dead workers)."""

from __future__ import annotations

SWEEP_EVERY_S = 15.0


def register(app) -> None:
    app.add_periodic_task(SWEEP_EVERY_S, app.signature("events.sweep_task"), name="events-sweep",
                          expire_seconds=30, expires=30)
