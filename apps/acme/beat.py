"""Periodic ACME work: look for certificates due for renewal (or a retry) once a minute."""

from __future__ import annotations

RENEW_CHECK_EVERY_S = 60.0


def register(app) -> None:
    app.add_periodic_task(RENEW_CHECK_EVERY_S, app.signature("acme.renew_due_task"), name="acme-renew-due")
