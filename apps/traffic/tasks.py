"""Celery tasks for traffic: thin, idempotent, JSON in and out."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from apps.traffic import services


@shared_task(name="traffic.rollup_task")
def rollup_task() -> int:
    """Fold 10 s overflow points into 5 min points."""
    return services.overflow_downsample()


@shared_task(name="traffic.prune_task")
def prune_task() -> dict[str, Any]:
    return services.traffic_prune()
