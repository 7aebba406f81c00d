"""Celery tasks for signals: thin, idempotent, JSON in and out."""

from __future__ import annotations

from celery import shared_task

from apps.signals import services


@shared_task(name="signals.rollup_task")
def rollup_task() -> int:
    """Sum the last closed 5-minute windows' 5 s buckets into 5 min buckets; drop rows past retention."""
    return services.signals_rollup()
