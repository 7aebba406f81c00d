"""Long garbage-collection pauses are logged (apps.core.gcpause), so a slow route change can be matched to one."""

from __future__ import annotations

import gc
import logging

import pytest

from apps.core import gcpause


@pytest.fixture
def installed():
    gcpause.install()
    gcpause.install()  # idempotent
    assert gc.callbacks.count(gcpause._timed) == 1
    yield
    gc.callbacks.remove(gcpause._timed)


def test_a_collection_at_least_slow_ms_long_is_logged_with_its_generation(installed, caplog, monkeypatch) -> None:
    caplog.set_level(logging.WARNING, logger="spillway.gc")
    monkeypatch.setattr(gcpause, "SLOW_MS", 10_000.0)
    gc.collect()
    assert not caplog.records
    monkeypatch.setattr(gcpause, "SLOW_MS", 0.0)
    cycles = [[] for _ in range(1000)]
    for a, b in zip(cycles, cycles[1:] + cycles[:1], strict=True):
        a.append(b)
    del cycles, a, b
    gc.collect()
    full = [r.getMessage() for r in caplog.records if "generation 2 paused this process for" in r.getMessage()]
    assert len(full) == 1 and int(full[0].rpartition("(")[2].split()[0]) >= 1000, full
