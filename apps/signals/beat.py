"""Periodic signals tasks: the coarse roll-up and retention (the collector writes the fine buckets)."""

from __future__ import annotations

ROLLUP_EVERY_S = 60.0


def register(app) -> None:
    app.add_periodic_task(ROLLUP_EVERY_S, app.signature("signals.rollup_task"), name="signals-rollup")
