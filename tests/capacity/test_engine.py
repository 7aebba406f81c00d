"""The load engine against real local HTTP servers (tests/capacity/servers.py), loopback only.

Every run here is bounded in rate, count and time; every server process is stopped by PID.
"""

from __future__ import annotations

import itertools
import threading
import time
import warnings
from collections.abc import Iterator

import pytest

from apps.capacity.engine import (
    ERROR_KINDS,
    LoadPlan,
    Progress,
    RunResult,
    Step,
    StepResult,
    Target,
    decode_histogram,
    merge_run_results,
    merge_step_results,
    run_plan,
    split_plan,
)
from apps.capacity.engine.plan import arrival_offset_s, count_arrivals
from apps.capacity.engine.results import new_histogram
from apps.capacity.knee import KneeResult, find_knee, summarize
from tests.capacity.capacitykit import served_in_full, stalled_not_queued

from .servers import ServerProcess, closed_port

pytestmark = pytest.mark.process  # the real load generator against real servers

CAPACITY_RPS = 100  # the capacity server's rate: one request at a time, SERVICE_MS each
SERVICE_MS = 1000.0 / CAPACITY_RPS
SLO_P99_MS = 200.0


@pytest.fixture(scope="module")
def ok_server() -> Iterator[ServerProcess]:
    with ServerProcess("ok") as server:
        yield server


def target(port: int, **kwargs) -> Target:
    return Target("127.0.0.1", port, **kwargs)


def no_errors(step: StepResult) -> bool:
    return step.error_count == 0


# --- rate accuracy --------------------------------------------------------------------------------


@pytest.mark.quiet
def test_open_loop_delivers_200_rps_for_2_s_within_2_percent(ok_server):
    result = run_plan(LoadPlan.constant(target(ok_server.port), 200, 2.0))
    step = result.steps[0]
    assert result.stopped_reason == "completed"
    assert step.sent == 400
    assert step.ok == 400 and no_errors(step)
    assert abs(step.achieved_rate - 200) <= 4, step
    assert step.offered_rate == 200
    # Keep-alive: a few connections carry all 400 requests; without it there would be one per request. More only
    # if this shared machine pauses the engine long enough for sends to pile up: a whole suite on 2 cores saw 47.
    assert result.connections_opened <= step.sent // 4, result.connections_opened
    assert 0 < step.p50_ms < 20


def test_a_linear_ramp_is_reported_as_slices_with_rising_offered_rate(ok_server):
    result = run_plan(LoadPlan.ramp(target(ok_server.port), 0, 400, 1.0, slices=4))
    offered = [s.offered_rate for s in result.steps]
    assert offered == [50, 150, 250, 350]
    # 0 -> 400 req/s over 1 s is 200 requests, more of them late than early. Each slice starts
    # with an arrival at its start, so a slice rounds its share up: 13 + 38 + 63 + 88.
    sent = [s.sent for s in result.steps]
    assert sent == [13, 38, 63, 88]
    assert sent == sorted(sent)
    assert all(no_errors(s) for s in result.steps)


# --- knee on a server whose capacity is known ------------------------------------------------------


def stalled(step) -> bool:
    """A step under capacity that missed its p99 to a stall of the machine: served in full, without errors. Its
    median may move: at 80 req/s of 100 a stall's backlog drains at only 20 req/s, so a 200 ms stall delays about
    half the step's requests (a whole-suite run saw the 80 req/s step at p99 233 ms); at 40 and 60 req/s the median
    stays within twice the service time (capacitykit.stalled_not_queued, which says so)."""
    if step.offered_rate >= 0.7 * CAPACITY_RPS:
        return served_in_full(step)
    return stalled_not_queued(step, SERVICE_MS)


@pytest.mark.quiet
def test_the_knee_is_found_within_one_step_of_a_servers_known_capacity():
    """GIVEN a server that serves exactly 100 req/s (one at a time, 10 ms each) and queues the rest
    WHEN open-loop steps run below and above 100 req/s
    THEN the knee lands within one step of 100, and above it the server serves only ~100 req/s."""
    rates = [40, 60, 80, 120, 140]

    def measure() -> tuple[RunResult, KneeResult]:
        with ServerProcess("capacity", "--rate", str(CAPACITY_RPS)) as server:
            result = run_plan(
                # 2 s steps: with 1 s ones, a whole-suite run on this 2-core machine once saw the 80 req/s step
                # reach 72 (what the starved generator sent and read back near a step's edge counts twice as much).
                LoadPlan.open_loop(target(server.port, timeout_s=5.0), [(r, 2.0) for r in rates])
            )
        # SLO far above the 10 ms service time so a busy machine's scheduling noise cannot fail a step below
        # capacity (at 100 ms, four test workers on 2 cores with a profiler attached once saw 140 ms at 60 req/s);
        # above capacity the queue grows by 20 requests a second, ~400 ms of waiting by the end of the 120 step.
        return result, find_knee(summarize(result.steps), slo_p99_ms=SLO_P99_MS, slo_error_rate=0.01)

    result, knee = measure()
    missed = [s for s in result.steps if s.offered_rate < CAPACITY_RPS and s.p99_ms > SLO_P99_MS]
    if missed and all(stalled(s) for s in missed):
        # A stall of the whole machine under capacity (four test workers on 2 cores once gave the 40 req/s step a
        # p99 of 207 ms, every request served): the run judged right on what it measured; where the knee is, is
        # measured once more. A server short of capacity fails the second measurement too.
        warnings.warn(f"engine knee: a stall's signature under capacity, measured again: {knee.reason}",
                      stacklevel=1)
        result, knee = measure()
    assert [s.offered_rate for s in result.steps] == rates
    assert knee.step_index is not None, knee.reason
    assert rates[knee.step_index] in (80, 120), knee.reason  # the steps either side of 100
    assert knee.capacity_rps == pytest.approx(rates[knee.step_index], rel=0.05)
    below, above = result.steps[2], result.steps[3]
    assert below.p99_ms < 200
    assert above.achieved_rate < 0.95 * above.offered_rate
    assert above.p99_ms > 250


# --- coordinated omission ------------------------------------------------------------------------


@pytest.mark.quiet
def test_a_one_second_stall_shows_in_open_loop_p99_but_hides_from_a_closed_loop():
    """GIVEN a server that answers at once except for one 1 s stall
    WHEN an open loop sends 100 req/s through it
    THEN p99 shows the stall: every request planned during it waited, timed from its intended send.

    A naive closed loop with one user sends nothing while its one request is stuck, so the stall
    costs it a single slow sample among thousands of fast ones: its p99 stays near the normal
    latency and only max shows the stall. That is coordinated omission; the open-loop number is the
    one a capacity test must use."""
    with ServerProcess("stall", "--stall-after-s", "0.5", "--stall-s", "1.0") as server:
        open_result = run_plan(LoadPlan.constant(target(server.port), 100, 2.0))
    open_step = open_result.steps[0]
    assert open_step.ok == 200 and no_errors(open_step)
    assert open_step.p99_ms >= 500, open_step
    assert open_step.max_ms >= 900

    # With a small pool the requests planned during the stall cannot even leave; they queue and
    # are still timed from their intended send.
    with ServerProcess("stall", "--stall-after-s", "0.5", "--stall-s", "1.0") as server:
        capped = run_plan(LoadPlan.constant(target(server.port), 100, 2.0, max_connections=5))
    capped_step = capped.steps[0]
    assert capped_step.ok == 200
    assert capped_step.pool_exhausted >= 80
    assert capped_step.p99_ms >= 500, capped_step
    assert capped.connections_opened <= 5

    with ServerProcess("stall", "--stall-after-s", "0.5", "--stall-s", "1.0") as server:
        closed_result = run_plan(LoadPlan.closed_loop(target(server.port), [(1, 2.0)]))
    closed_step = closed_result.steps[0]
    assert closed_step.max_ms >= 900  # the stall happened to it too...
    assert closed_step.p99_ms < 100, closed_step  # ...but its p99 does not show it


# --- errors by kind --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("server_args", "kind"),
    [
        (("status", "--code", "503"), "non_2xx"),
        (("reset",), "reset"),
        (("blackhole",), "timeout"),
        (("garbage",), "bad_response"),
    ],
)
def test_each_failure_is_counted_under_its_kind(server_args, kind):
    with ServerProcess(*server_args) as server:
        started = time.monotonic()
        result = run_plan(LoadPlan.constant(target(server.port, timeout_s=0.3), 40, 0.5))
        elapsed_s = time.monotonic() - started
    step = result.steps[0]
    assert step.sent == 20
    assert step.ok == 0
    assert step.errors[kind] == 20, step.errors
    assert step.error_count == 20
    assert step.error_rate == 1.0
    assert elapsed_s < 2.0  # a silent server costs the timeout, not the default drain


def test_a_closed_port_counts_as_refused():
    result = run_plan(LoadPlan.constant(target(closed_port()), 50, 0.4))
    step = result.steps[0]
    assert step.sent == 20
    assert step.errors["refused"] == 20
    assert set(ERROR_KINDS) == set(step.errors)


def test_closed_loop_users_back_off_on_a_closed_port_instead_of_flooding_it():
    result = run_plan(LoadPlan.closed_loop(target(closed_port()), [(2, 0.3)]))
    refused = result.steps[0].errors["refused"]
    assert 2 <= refused <= 2 * (0.3 / 0.01) + 4


# --- shards ----------------------------------------------------------------------------------------


def run_in_threads(plans: list[LoadPlan]) -> list[RunResult]:
    results: list[RunResult | None] = [None] * len(plans)

    def work(i: int) -> None:
        results[i] = run_plan(plans[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert all(r is not None for r in results)
    return results  # type: ignore[return-value]


def test_two_shards_merge_into_exact_totals_and_percentiles(ok_server):
    plan = LoadPlan.open_loop(target(ok_server.port), [(200, 0.5), (400, 0.5)])
    shards = split_plan(plan, 2)
    assert [s.steps[1].rate for s in shards] == [200, 200]
    a, b = run_in_threads(shards)
    merged = merge_run_results([a, b])
    for i, step in enumerate(merged.steps):
        sa, sb = a.steps[i], b.steps[i]
        assert step.ok == sa.ok + sb.ok
        assert step.sent == sa.sent + sb.sent
        assert step.errors == {k: sa.errors[k] + sb.errors[k] for k in ERROR_KINDS}
        assert step.offered_rate == plan.steps[i].rate
        assert step.achieved_rate == pytest.approx(sa.achieved_rate + sb.achieved_rate)
        hist = decode_histogram(sa.histogram)
        hist.add(decode_histogram(sb.histogram))
        assert decode_histogram(step.histogram).get_total_count() == step.ok
        assert step.p99_ms == round(hist.get_value_at_percentile(99.0) / 1000, 3)
        assert step.max_ms == max(sa.max_ms, sb.max_ms)
    assert merged.steps[0].sent == 100 and merged.steps[1].sent == 200


def test_merged_percentiles_come_from_the_merged_histogram_not_an_average():
    fast, slow = new_histogram(), new_histogram()
    fast.record_value(1_000, 99)  # 99 requests at 1 ms
    slow.record_value(500_000, 1)  # 1 request at 500 ms
    slow.record_value(2_000, 9)

    def result(hist, ok: int) -> StepResult:
        return StepResult.build(
            offered_rate=10, achieved_rate=10, duration_s=1, ok=ok, errors={}, hist=hist
        )

    merged = merge_step_results([result(fast, 99), result(slow, 10)])
    assert merged.ok == 109
    assert merged.p50_ms == pytest.approx(1.0, rel=0.01)
    assert merged.p99_ms == pytest.approx(2.0, rel=0.01)  # 99 + 9 = 108 of 109 are <= 2 ms
    assert merged.p999_ms == pytest.approx(500, rel=0.01)
    assert merged.max_ms == pytest.approx(500, rel=0.01)
    assert merged.offered_rate == 20
    # Round-trips through JSON-friendly dicts for Celery.
    assert StepResult.from_dict(merged.to_dict()) == merged


# --- bounds, cancel, progress -----------------------------------------------------------------------


def test_max_requests_stops_the_run_at_exactly_that_many(ok_server):
    started = time.monotonic()
    result = run_plan(LoadPlan.constant(target(ok_server.port), 1000, 5.0, max_requests=50))
    assert time.monotonic() - started < 1.0
    assert result.stopped_reason == "max_requests"
    assert sum(s.sent for s in result.steps) == 50
    assert result.total.ok == 50


def test_closed_loop_max_requests_is_exact_too(ok_server):
    result = run_plan(LoadPlan.closed_loop(target(ok_server.port), [(4, 5.0)], max_requests=500))
    assert result.stopped_reason == "max_requests"
    assert result.total.requests == 500
    assert result.elapsed_s < 2.0


def test_a_run_stops_by_itself_when_its_duration_is_over(ok_server):
    started = time.monotonic()
    result = run_plan(LoadPlan.closed_loop(target(ok_server.port), [(2, 0.5), (4, 0.5)]))
    assert time.monotonic() - started < 2.0  # 1.0 s planned; the rest is set-up and draining, slower under load
    assert result.stopped_reason == "completed"
    assert [s.users for s in result.steps] == [2, 4]
    assert all(s.ok > 0 and no_errors(s) for s in result.steps)


def test_max_duration_is_a_hard_wall_clock_cap(ok_server):
    started = time.monotonic()
    result = run_plan(LoadPlan.constant(target(ok_server.port), 100, 10.0, max_duration_s=0.8))
    assert time.monotonic() - started < 1.6  # 0.8 s cap, against the 10 s planned
    assert result.stopped_reason == "max_duration"
    assert 60 <= result.steps[0].sent <= 90


@pytest.mark.parametrize("hook", ["event", "callable"])
def test_cancel_stops_a_long_run_within_a_second(ok_server, hook):
    event = threading.Event()
    cancel = event if hook == "event" else event.is_set
    timer = threading.Timer(0.5, event.set)
    timer.start()
    try:
        started = time.monotonic()
        result = run_plan(LoadPlan.constant(target(ok_server.port), 100, 20.0), cancel=cancel)
        elapsed_s = time.monotonic() - started
    finally:
        timer.cancel()
    assert result.stopped_reason == "cancelled"
    assert elapsed_s < 2.0  # cancelled at 0.5 s of the 20 s planned
    assert result.steps[0].duration_s < 1.2
    assert result.steps[0].ok + result.abandoned == result.steps[0].sent


def test_progress_is_reported_about_every_half_second_and_ends_at_100(ok_server):
    seen: list[Progress] = []
    run_plan(LoadPlan.open_loop(target(ok_server.port), [(100, 0.8), (200, 0.8)]), progress=seen.append)
    assert 3 <= len(seen) <= 5
    percents = [p.percent for p in seen]
    assert percents == sorted(percents) and percents[-1] == 100.0
    assert seen[-1].step_count == 2 and seen[-1].step_index == 1
    assert seen[-1].sent == 80 + 160 and seen[-1].ok == 240 and seen[-1].errors == 0
    assert any(90 <= p.achieved_rate <= 220 for p in seen[:-1])


def test_closed_loop_think_time_paces_each_user(ok_server):
    result = run_plan(LoadPlan.closed_loop(target(ok_server.port), [(1, 1.0)], think_time_s=0.1))
    assert 7 <= result.total.ok <= 11  # ~10 at 0.1 s think time; fewer when each request is slow under load


def test_a_progress_callback_that_fails_does_not_abort_the_run(ok_server):
    def broken(progress: Progress) -> None:
        raise RuntimeError("database went away")

    result = run_plan(LoadPlan.constant(target(ok_server.port), 50, 0.7), progress=broken)
    assert result.stopped_reason == "completed" and result.total.ok == 35


# --- plans (pure) ----------------------------------------------------------------------------------


def test_arrivals_are_evenly_paced_and_ramps_integrate_the_rate():
    assert [arrival_offset_s(4, 4, 1.0, k) for k in range(5)] == [0.0, 0.25, 0.5, 0.75, None]
    assert count_arrivals(200, 200, 2.0) == 400
    assert count_arrivals(0, 400, 1.0) == 200
    assert count_arrivals(400, 0, 1.0) == 200
    assert count_arrivals(0, 0, 1.0) == 0
    offsets = [arrival_offset_s(0, 100, 1.0, k) for k in range(50)]
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert gaps == sorted(gaps, reverse=True)  # arrivals come closer together as the rate rises


def test_split_plan_shares_rate_requests_and_users():
    t = Target("127.0.0.1", 8080)
    plan = LoadPlan.open_loop(t, [(300, 1.0), (301, 1.0)], max_connections=10)
    shards = split_plan(plan, 3)
    assert sum(s.steps[1].rate for s in shards) == pytest.approx(301)
    assert sum(s.max_requests for s in shards) == plan.max_requests
    assert all(s.max_connections == 4 for s in shards)
    closed = LoadPlan.closed_loop(t, [(5, 1.0), (1, 1.0)])
    users = [[st.users for st in s.steps] for s in split_plan(closed, 2)]
    assert users == [[3, 1], [2, 0]]


def test_plans_round_trip_through_dicts():
    plan = LoadPlan.ramp(Target("127.0.0.1", 80, "/x", "api.example.com", 2.0), 10, 20, 2.0, slices=2)
    assert LoadPlan.from_dict(plan.to_dict()) == plan
    assert plan.target.request_bytes().startswith(b"GET /x HTTP/1.1\r\nHost: api.example.com\r\n")


@pytest.mark.parametrize(
    "bad",
    [
        {"path": "/a b"},
        {"path": "/a\r\nX-Injected: 1"},
        {"path": "noslash"},
        {"host_header": "evil.com\r\nX: y"},
        {"port": 0},
        {"timeout_s": 0},
    ],
)
def test_targets_refuse_values_that_could_split_the_request(bad):
    fields = {"host": "127.0.0.1", "port": 80, **bad}
    with pytest.raises(ValueError):
        Target(**fields)


def test_caps_are_enforced_when_the_plan_is_built():
    t = Target("127.0.0.1", 80)
    with pytest.raises(ValueError, match="exceeds max_rate"):
        LoadPlan.constant(t, 5000, 1.0, max_rate=1000)
    with pytest.raises(ValueError, match="users"):
        LoadPlan.closed_loop(t, [(50, 1.0)], max_connections=10)
    with pytest.raises(ValueError, match="max_duration_s"):
        LoadPlan.constant(t, 10, 1.0, max_duration_s=100_000)
    with pytest.raises(ValueError, match="duration_s"):
        LoadPlan(t, "open", (Step(duration_s=0, rate=1),), 1.0, 1)
