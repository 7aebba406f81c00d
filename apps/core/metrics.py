"""Prometheus collectors. Apps add theirs through `register_collector`."""

from __future__ import annotations

from prometheus_client import REGISTRY

_registered: set[str] = set()


def register_collector(name: str, collector) -> None:
    # Idempotent: Django may import modules twice under the autoreloader.
    if name in _registered:
        return
    REGISTRY.register(collector)
    _registered.add(name)
