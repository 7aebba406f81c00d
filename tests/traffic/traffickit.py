"""Helpers of the traffic tests: region capacities and random overflow scenarios for the
planner, and node readings recorded as the collector would."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from hypothesis import strategies as st

from apps.traffic import services
from apps.traffic.observe import BackendReading
from apps.traffic.overflow import RegionCapacity
from apps.traffic.services import NodeReadings


def cap(region: str, capacity_rps: float | None, *, healthy: int = 1, scaler: float = 1.0) -> RegionCapacity:
    """A region whose capacity is `capacity_rps` spread over `healthy` members."""
    per_member = None if capacity_rps is None else capacity_rps / max(healthy, 1)
    return RegionCapacity(region, healthy, per_member, scaler)


def reading(backend: str, total: int, rate: float = 0.0) -> BackendReading:
    return BackendReading(backend=backend, rate_per_s=rate, sessions=0, requests_total=total)


def record_steady_load(pool_id: int, *, a_local: float, a_out: float, b_local: float, seconds: int = 20) -> None:
    """Two nodes (one per region) reporting every 5 s with counters growing at the given rates."""
    start = timezone.now() - timedelta(seconds=seconds)
    for step in range(seconds // 5 + 1):
        at = start + timedelta(seconds=5 * step)
        t = 5 * step
        services.readings_record(at=at, nodes=[
            NodeReadings(None, "fa/n1", "ra", [reading(f"p{pool_id}_ra", int(a_local * t)),
                                               reading(f"p{pool_id}_rb", int(a_out * t))]),
            NodeReadings(None, "fb/n1", "rb", [reading(f"p{pool_id}_rb", int(b_local * t)),
                                               reading(f"p{pool_id}_ra", 0)]),
        ])


REGIONS = ["a", "b", "c", "d", "e"]


Scenario = tuple[dict[str, float], list[RegionCapacity], dict[tuple[str, str], float]]


# Built once: a strategy made inside the composite is built and validated again on every draw, which was most of
# the property tests' time (~7 of ~9 ms an example).
_POOL_REGIONS = st.lists(st.sampled_from(REGIONS), min_size=1, max_size=5, unique=True)
_HEALTHY = st.integers(0, 4)
_ONE_IN_TEN = st.integers(0, 9)
_PER_MEMBER = st.floats(0, 100)
_SCALER = st.sampled_from([0.0, 0.1, 0.5, 0.75, 1.0])
_DEMAND = st.dictionaries(st.sampled_from(REGIONS), st.floats(0, 500), max_size=5)
_PAIRS = [(x, y) for i, x in enumerate(REGIONS) for y in REGIONS[i + 1 :]]
# Small integer RTTs make ties common, which is where ordering bugs hide.
_DISTANCES = st.dictionaries(st.sampled_from(_PAIRS), st.integers(1, 6).map(float), max_size=len(_PAIRS))


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    pool_regions = draw(_POOL_REGIONS)
    capacities = [
        RegionCapacity(
            region,
            draw(_HEALTHY),
            None if draw(_ONE_IN_TEN) == 0 else draw(_PER_MEMBER),  # 1 in 10 unlimited
            draw(_SCALER),
        )
        for region in pool_regions
    ]
    demand = draw(_DEMAND)
    distances = draw(_DISTANCES)
    return demand, capacities, distances
