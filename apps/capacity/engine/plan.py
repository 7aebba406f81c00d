"""What a load run does: the target, the schedule of steps, and the caps that bound it.

Plain frozen dataclasses that round-trip through JSON (`to_dict` / `from_dict`) so a Celery task can
receive a plan by value. Validation happens at construction: a plan that exists is a plan the engine
may run.
"""

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

Mode = Literal["open", "closed"]

# Absolute ceilings, whatever a plan asks for: one process cannot honestly drive more than this,
# and a capacity test is never meant to be a soak test.
HARD_MAX_RATE = 100_000.0
HARD_MAX_CONNECTIONS = 10_000
HARD_MAX_DURATION_S = 3600.0
HARD_MAX_REQUESTS = 100_000_000

# How long outstanding requests may finish after the schedule ends when the target has no
# per-request timeout; anything still open then counts as a timeout.
DEFAULT_DRAIN_S = 10.0

# Header values go verbatim into the request bytes, so anything that could end a line or a
# token is refused (request splitting / header injection).
_HOST_RE = re.compile(r"^[A-Za-z0-9.\-:\[\]]{1,253}$")
_PATH_RE = re.compile(r"^/[\x21-\x7e]{0,2047}$")


@dataclass(frozen=True)
class Target:
    """One HTTP endpoint: the engine connects to host:port and sends `GET path` with `Host: host_header`."""

    host: str
    port: int
    path: str = "/"
    host_header: str = ""
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not _HOST_RE.match(self.host):
            raise ValueError(f"target host {self.host!r} is not a hostname or IP address")
        if not 1 <= self.port <= 65535:
            raise ValueError(f"target port {self.port} is outside 1..65535")
        if not _PATH_RE.match(self.path):
            raise ValueError(f"target path {self.path!r} must start with / and hold no spaces or controls")
        if self.host_header and not _HOST_RE.match(self.host_header):
            raise ValueError(f"Host header {self.host_header!r} is not a hostname[:port]")
        if self.timeout_s is not None and not 0 < self.timeout_s <= HARD_MAX_DURATION_S:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    @property
    def effective_host_header(self) -> str:
        if self.host_header:
            return self.host_header
        return self.host if self.port == 80 else f"{self.host}:{self.port}"

    def request_bytes(self) -> bytes:
        """The exact bytes of every request, built once per run."""
        return (
            f"GET {self.path} HTTP/1.1\r\n"
            f"Host: {self.effective_host_header}\r\n"
            "User-Agent: spillway-loadgen\r\n"
            "Accept: */*\r\n\r\n"
        ).encode("ascii")


@dataclass(frozen=True)
class Step:
    """One phase of a run.

    Open loop: arrivals go from `rate` to `end_rate` (req/s) linearly over `duration_s`
    (`end_rate` None means constant). Closed loop: `users` concurrent users for `duration_s`.
    """

    duration_s: float
    rate: float = 0.0
    end_rate: float | None = None
    users: int = 0

    @property
    def final_rate(self) -> float:
        return self.rate if self.end_rate is None else self.end_rate

    @property
    def mean_rate(self) -> float:
        return (self.rate + self.final_rate) / 2.0

    @property
    def planned_requests(self) -> int:
        """Arrivals an open-loop run schedules in this step (closed form of the arrival law)."""
        return count_arrivals(self.rate, self.final_rate, self.duration_s)


def arrival_offset_s(rate: float, end_rate: float, duration_s: float, k: int) -> float | None:
    """Offset from the step start of the k-th arrival (k from 0), or None once past the step.

    Arrivals are evenly paced (not Poisson): the k-th one is where the integral of the rate
    reaches k, so a constant rate gives k / rate and a ramp solves a quadratic. Computed from k
    each time, so no error accumulates over long steps.
    """
    if rate == end_rate:
        if rate <= 0.0:
            return None
        t = k / rate
    else:
        # N(t) = rate*t + a*t^2 with a = (end_rate - rate) / (2 * duration_s); solve N(t) = k.
        a = (end_rate - rate) / (2.0 * duration_s)
        disc = rate * rate + 4.0 * a * k
        if disc < 0.0:
            return None
        # Rationalised root: stable when a is tiny and never divides by zero.
        denom = rate + math.sqrt(disc)
        if denom <= 0.0:
            return 0.0 if k == 0 else None
        t = 2.0 * k / denom
    return t if t < duration_s else None


def count_arrivals(rate: float, end_rate: float, duration_s: float) -> int:
    total = (rate + end_rate) / 2.0 * duration_s
    n = math.ceil(total - 1e-9)
    # Boundary rounding can put the last arrival exactly on the step end; trust the pacing law.
    while n > 0 and arrival_offset_s(rate, end_rate, duration_s, n - 1) is None:
        n -= 1
    return max(n, 0)


@dataclass(frozen=True)
class LoadPlan:
    """A bounded run: steps plus the caps that stop it by itself.

    `max_duration_s` is a wall-clock ceiling that includes draining outstanding requests;
    `max_requests` caps the number of requests started; `max_rate` and `max_connections` are
    refused up front if a step would need more.
    """

    target: Target
    mode: Mode
    steps: tuple[Step, ...]
    max_duration_s: float
    max_requests: int
    max_rate: float = 20_000.0
    max_connections: int = 1_000
    think_time_s: float = 0.0
    drain_s: float = field(default=0.0)

    def __post_init__(self) -> None:
        if self.mode not in ("open", "closed"):
            raise ValueError(f"mode must be 'open' or 'closed', got {self.mode!r}")
        if not self.steps:
            raise ValueError("a plan needs at least one step")
        if not 0 < self.max_duration_s <= HARD_MAX_DURATION_S:
            raise ValueError(f"max_duration_s must be in (0, {HARD_MAX_DURATION_S}]")
        if not 0 < self.max_requests <= HARD_MAX_REQUESTS:
            raise ValueError(f"max_requests must be in (0, {HARD_MAX_REQUESTS}]")
        if not 0 < self.max_rate <= HARD_MAX_RATE:
            raise ValueError(f"max_rate must be in (0, {HARD_MAX_RATE}]")
        if not 0 < self.max_connections <= HARD_MAX_CONNECTIONS:
            raise ValueError(f"max_connections must be in (0, {HARD_MAX_CONNECTIONS}]")
        if self.think_time_s < 0 or self.drain_s < 0:
            raise ValueError("think_time_s and drain_s must not be negative")
        for i, step in enumerate(self.steps):
            if not 0 < step.duration_s <= HARD_MAX_DURATION_S:
                raise ValueError(f"step {i}: duration_s must be in (0, {HARD_MAX_DURATION_S}]")
            if self.mode == "open":
                if step.rate < 0 or step.final_rate < 0:
                    raise ValueError(f"step {i}: rates must not be negative")
                peak = max(step.rate, step.final_rate)
                if peak > self.max_rate:
                    raise ValueError(f"step {i}: rate {peak} req/s exceeds max_rate {self.max_rate}")
            elif not 0 <= step.users <= self.max_connections:
                raise ValueError(f"step {i}: users {step.users} must be in 0..max_connections")

    @property
    def schedule_s(self) -> float:
        return sum(step.duration_s for step in self.steps)

    @property
    def effective_drain_s(self) -> float:
        if self.drain_s:
            return self.drain_s
        return self.target.timeout_s if self.target.timeout_s is not None else DEFAULT_DRAIN_S

    # --- constructors ---------------------------------------------------------------------------

    @classmethod
    def open_loop(
        cls,
        target: Target,
        steps: list[tuple[float, float]] | list[Step],
        *,
        max_duration_s: float | None = None,
        max_requests: int | None = None,
        **caps: Any,
    ) -> LoadPlan:
        """Open loop over `[(rate, duration_s), ...]` or explicit `Step`s."""
        built = tuple(s if isinstance(s, Step) else Step(duration_s=s[1], rate=s[0]) for s in steps)
        return cls._bounded(target, "open", built, max_duration_s, max_requests, **caps)

    @classmethod
    def constant(cls, target: Target, rate: float, duration_s: float, **kwargs: Any) -> LoadPlan:
        return cls.open_loop(target, [(rate, duration_s)], **kwargs)

    @classmethod
    def ramp(
        cls,
        target: Target,
        start_rate: float,
        end_rate: float,
        duration_s: float,
        *,
        slices: int = 10,
        **kwargs: Any,
    ) -> LoadPlan:
        """A linear ramp, reported as `slices` equal steps (each its own StepResult for the knee)."""
        if slices < 1:
            raise ValueError("slices must be >= 1")
        slice_s = duration_s / slices
        delta = (end_rate - start_rate) / slices
        built = [
            Step(duration_s=slice_s, rate=start_rate + i * delta, end_rate=start_rate + (i + 1) * delta)
            for i in range(slices)
        ]
        return cls.open_loop(target, built, **kwargs)

    @classmethod
    def closed_loop(
        cls,
        target: Target,
        steps: list[tuple[int, float]],
        *,
        think_time_s: float = 0.0,
        max_duration_s: float | None = None,
        max_requests: int | None = None,
        **caps: Any,
    ) -> LoadPlan:
        """Closed loop over `[(users, duration_s), ...]`."""
        built = tuple(Step(duration_s=d, users=u) for u, d in steps)
        caps.setdefault("max_connections", max(max(u for u, _ in steps), 1))
        return cls._bounded(
            target, "closed", built, max_duration_s, max_requests, think_time_s=think_time_s, **caps
        )

    @classmethod
    def _bounded(
        cls,
        target: Target,
        mode: Mode,
        steps: tuple[Step, ...],
        max_duration_s: float | None,
        max_requests: int | None,
        **caps: Any,
    ) -> LoadPlan:
        schedule_s = sum(s.duration_s for s in steps)
        if max_duration_s is None:
            drain_s = caps.get("drain_s") or (target.timeout_s if target.timeout_s else DEFAULT_DRAIN_S)
            max_duration_s = min(schedule_s + drain_s + 1.0, HARD_MAX_DURATION_S)
        if max_requests is None:
            planned = max(sum(s.planned_requests for s in steps), 1)
            max_requests = planned if mode == "open" else HARD_MAX_REQUESTS
        return cls(target, mode, steps, max_duration_s, max_requests, **caps)

    # --- serialisation --------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["steps"] = [asdict(s) for s in self.steps]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> LoadPlan:
        fields = dict(data)
        fields["target"] = Target(**fields["target"])
        fields["steps"] = tuple(Step(**s) for s in fields["steps"])
        return cls(**fields)


def _share(total: int, shards: int, index: int) -> int:
    """Integer split of `total` into `shards` parts whose sum is exactly `total`."""
    return total // shards + (1 if index < total % shards else 0)


def split_plan(plan: LoadPlan, shards: int) -> list[LoadPlan]:
    """Split a plan into `shards` plans that together offer the original load.

    Open loop: each shard gets rate/shards on every step (and its share of max_rate, max_requests,
    max_connections). Closed loop: users are dealt out so the counts sum to the original, so a shard
    may get 0 users on a step. Durations and per-request timeouts are unchanged, so shards started
    together run in lockstep and `merge_run_results` can add them step by step.
    """
    if shards < 1:
        raise ValueError("shards must be >= 1")
    if shards == 1:
        return [plan]
    out: list[LoadPlan] = []
    for i in range(shards):
        if plan.mode == "open":
            steps = tuple(
                replace(
                    s,
                    rate=s.rate / shards,
                    end_rate=None if s.end_rate is None else s.end_rate / shards,
                )
                for s in plan.steps
            )
            conns = max(math.ceil(plan.max_connections / shards), 1)
        else:
            steps = tuple(replace(s, users=_share(s.users, shards, i)) for s in plan.steps)
            conns = max(max((s.users for s in steps), default=1), 1)
        out.append(
            replace(
                plan,
                steps=steps,
                max_rate=plan.max_rate / shards,
                max_requests=max(_share(plan.max_requests, shards, i), 1),
                max_connections=conns,
            )
        )
    return out
