"""The rules a capacity test must satisfy, shared by the writes (services) and the run that starts later
(execution): step shapes, caps and budget inputs, the target re-check, and the engine's load plan. Reads
only; nothing here writes."""

from __future__ import annotations

import math
from typing import Any

from apps.accounts.models import Organization
from apps.balancers.models import Pool, PoolRegion
from apps.capacity import engine, safety
from apps.capacity.models import CapacityTest
from apps.core.errors import DoesNotExist, DomainError

MAX_STEPS = 50
MAX_SHARDS = 16
MAX_TIMEOUT_S = 60.0
DEFAULT_MAX_CONNECTIONS = 100
# A failover drill's bounds (low, high): the API, the pool page's form, the job kind and the service agree.
DRILL_SHARE = (0.05, 1.0)
DRILL_DURATION_S = (5.0, 3600.0)
DRILL_P99_MS = (1.0, 60_000.0)


def caps_of(org: Organization) -> safety.Caps:
    return safety.Caps(max_rate=float(org.max_test_rate), max_duration_s=float(org.max_test_duration_s),
                       max_concurrency=int(org.max_test_concurrency))


def load_of(test: CapacityTest) -> safety.Load:
    if test.mode == CapacityTest.Mode.OPEN:
        return safety.Load(peak_rate=test.peak_load, schedule_s=test.schedule_s,
                           concurrency=int(test.max_connections))
    return safety.Load(peak_rate=0.0, schedule_s=test.schedule_s, concurrency=int(test.peak_load))


def normalize_steps(raw: Any, *, step_duration_s: float, mode: str) -> list[list[float]]:
    """Steps as [[rate_or_users, duration_s], ...]; a bare number takes the test's step duration."""
    if not isinstance(raw, list) or not raw:
        raise DomainError("invalid_steps", "Give at least one step.", field="steps")
    if len(raw) > MAX_STEPS:
        raise DomainError("invalid_steps", f"At most {MAX_STEPS} steps.", field="steps")
    out: list[list[float]] = []
    for i, item in enumerate(raw):
        if isinstance(item, int | float) and not isinstance(item, bool):
            value, duration = item, step_duration_s
        elif isinstance(item, list | tuple) and len(item) == 2:
            value, duration = item
        else:
            raise DomainError("invalid_steps", f"Step {i + 1} must be a number or [value, duration_s].",
                              field="steps")
        try:
            value, duration = float(value), float(duration)
        except (TypeError, ValueError):
            raise DomainError("invalid_steps", f"Step {i + 1} must hold numbers.", field="steps") from None
        if not (math.isfinite(value) and math.isfinite(duration)) or value <= 0 or not 0 < duration <= 3600:
            raise DomainError("invalid_steps", f"Step {i + 1}: the value must be > 0 and the duration in "
                                               "(0, 3600] s.", field="steps")
        if mode == CapacityTest.Mode.CLOSED:
            if value != int(value):
                raise DomainError("invalid_steps", f"Step {i + 1}: users must be a whole number.",
                                  field="steps")
            value = int(value)
        out.append([value, duration])
    return out


def capacity_test_check(test: CapacityTest) -> safety.ResolvedTarget:
    """Everything a test must satisfy, whoever wrote it: shape, pool, caps, target. Returns the target."""
    if not 0 < test.slo_p99_ms <= 60_000:
        raise DomainError("invalid_slo", "slo_p99_ms must be in (0, 60000].", field="slo_p99_ms")
    if not 0 <= test.slo_error_rate <= 1:
        raise DomainError("invalid_slo", "slo_error_rate must be between 0 and 1.", field="slo_error_rate")
    if not 1 <= test.shards <= MAX_SHARDS:
        raise DomainError("invalid_shards", f"shards must be 1..{MAX_SHARDS}.", field="shards")
    if not 0 < test.safety_factor <= 1:
        raise DomainError("invalid_safety_factor", "safety_factor must be in (0, 1].", field="safety_factor")
    if not 0 < test.timeout_s <= MAX_TIMEOUT_S:
        raise DomainError("invalid_timeout", f"timeout_s must be in (0, {MAX_TIMEOUT_S:g}].", field="timeout_s")
    if test.mode == CapacityTest.Mode.OPEN and test.max_connections < test.shards:
        raise DomainError("invalid_connections", "max_connections must be at least the number of shards.",
                          field="max_connections")
    if test.pool_id is not None:
        pool = Pool.objects.filter(pk=test.pool_id).first()
        if pool is None or (pool.org_id != test.org_id and not test.org.is_operator):
            raise DoesNotExist("Pool not found.", field="pool")
        if test.region_id is not None and not PoolRegion.objects.filter(pool=pool, region_id=test.region_id).exists():
            raise DomainError("invalid_region", "The pool has no capacity row in that region.", field="region")
    safety.check_caps(load_of(test), caps_of(test.org))
    target = safety.target_resolve(test=test)
    plan_for(test, target)  # the engine's own checks (header injection, bounds) run here too
    return target


def plan_for(test: CapacityTest, target: safety.ResolvedTarget) -> engine.LoadPlan:
    try:
        t = engine.Target(host=target.address, port=target.port, path=target.path,
                          host_header=target.host_header, timeout_s=test.timeout_s)
        if test.mode == CapacityTest.Mode.OPEN:
            return engine.LoadPlan.open_loop(
                t, [(float(v), float(d)) for v, d in test.steps],
                max_rate=max(test.peak_load, 0.001), max_connections=int(test.max_connections))
        return engine.LoadPlan.closed_loop(t, [(int(v), float(d)) for v, d in test.steps],
                                           think_time_s=test.think_time_s)
    except ValueError as exc:
        raise DomainError("invalid_plan", f"The load engine refuses this test: {exc}.") from exc
