"""Celery tasks for traffic: thin, idempotent, JSON in and out."""

from __future__ import annotations

from typing import Any

from celery import shared_task

from apps.traffic import services


@shared_task(name="traffic.observe_task")
def observe_task() -> int:
    """Record samples from the fleets hot copy that the collector did not record itself."""
    return services.hot_copy_record()


@shared_task(name="traffic.capacity_watch_task")
def capacity_watch_task() -> list[int]:
    """Re-render fleets whose pools' healthy capacity changed (returns the LB ids)."""
    return services.capacity_watch()


@shared_task(name="traffic.rollup_task")
def rollup_task() -> int:
    """Fold 10 s overflow points into 5 min points."""
    return services.overflow_downsample()


@shared_task(name="traffic.prune_task")
def prune_task() -> dict[str, Any]:
    return services.traffic_prune()
