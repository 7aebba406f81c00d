"""Periodic drift plan of applied cloud load balancers."""

from __future__ import annotations

DRIFT_PLAN_INTERVAL_S = 3600.0


def register(app) -> None:
    app.add_periodic_task(DRIFT_PLAN_INTERVAL_S, app.signature("cloud.drift_task"), name="cloud drift plan")
