"""The web server's fair turns at its request threads (controlplane/fairturns.py), in asyncio alone; the
same under a real gunicorn with two tenants' requests: tests/core/test_fair_server.py."""

from __future__ import annotations

import asyncio
import math

import pytest

from controlplane.fairturns import CROWD_S, LEARNED_MAX, PRECEDENCE_S, FairTurns, credential
from tests.waiting import run_coroutine


class Jobs:
    """Jobs that run until released, recording the order in which they started."""

    def __init__(self, turns: FairTurns) -> None:
        self.turns = turns
        self.started: list[str] = []
        self.gates: dict[str, asyncio.Event] = {}
        self.tasks: dict[str, asyncio.Task] = {}

    def submit(self, key: str, name: str) -> None:
        gate = self.gates[name] = asyncio.Event()

        async def job() -> str:
            self.started.append(name)
            await gate.wait()
            return name

        self.tasks[name] = asyncio.ensure_future(self.turns.run(key, job))

    async def finish(self, name: str) -> None:
        self.gates[name].set()
        await self.tasks[name]
        await asyncio.sleep(0)  # the granted waiter starts


async def _settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


class Clock:
    """The turns' idea of now, moved by hand (the re-check timer still runs on the loop's real time)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_tenants_burst_leaves_a_thread_for_the_next_tenant_and_shrinks_to_one_while_others_are_about() -> None:
    """GIVEN 4 threads and tenant A alone sending 10 requests at once, THEN A runs 3 and the 4th thread waits;
    tenant B's request starts at once, and C's (no thread free) starts at the next release, before A's queue.
    WHILE B or C runs, waits or was seen within CROWD_S, A runs one request at a time (a thread stays free);
    once they have been gone that long, A takes all threads but one again, without anything else happening."""

    async def scenario() -> None:
        clock = Clock()
        jobs = Jobs(FairTurns(4, clock=clock))
        for i in range(10):
            jobs.submit("org:a", f"a{i}")
        await _settle()
        assert jobs.started == ["a0", "a1", "a2"]
        jobs.submit("org:b", "b0")
        await _settle()
        assert jobs.started[-1] == "b0"
        jobs.submit("org:c", "c0")
        await _settle()
        assert "c0" not in jobs.started
        await jobs.finish("a0")
        assert jobs.started[-1] == "c0"  # not a3: A is over its share while C waits
        await jobs.finish("c0")
        await jobs.finish("a1")
        assert "a3" not in jobs.started and jobs.turns.free == 2  # A runs a2: its one while B runs and C was seen
        await jobs.finish("b0")
        await jobs.finish("a2")
        assert jobs.started[-1] == "a3" and "a4" not in jobs.started  # one at a time: B and C were just seen
        assert jobs.turns.share_of("org:a") == 1
        clock.now += CROWD_S + 0.01
        await asyncio.sleep(CROWD_S / 4 + 0.1)  # the re-check: nothing else happens meanwhile
        assert jobs.started[-2:] == ["a4", "a5"] and jobs.turns.free == 1  # alone: all threads but one
        assert jobs.turns.share_of("org:a") == 3
        for name in [n for n in jobs.gates if not jobs.tasks[n].done()]:
            jobs.gates[name].set()
        await asyncio.gather(*jobs.tasks.values())
        assert sorted(jobs.started) == sorted(jobs.gates)  # nothing lost
        assert jobs.turns.free == 4 and not jobs.turns.running and not jobs.turns.turn

    run_coroutine(scenario())


def test_the_crowd_is_other_tenants_only() -> None:
    """A tenant alone is never crowded by its own requests, however recent; any other tenant's request running,
    waiting or seen within CROWD_S crowds it, and an expired sighting does not."""

    async def scenario() -> None:
        clock = Clock()
        turns = FairTurns(4, clock=clock)
        await turns._acquire("org:a")
        turns._release("org:a")
        assert turns.share_of("org:a") == 3
        await turns._acquire("org:b")
        assert turns.share_of("org:a") == 1 and turns.share_of("org:b") == 1  # b runs; a was just seen
        clock.now += 10
        assert turns.share_of("org:a") == 1  # b still runs
        assert turns.share_of("org:b") == 3  # a's sighting expired
        turns._release("org:b")
        assert turns.share_of("org:a") == 1  # b just ended
        clock.now += CROWD_S + 0.01
        assert turns.share_of("org:a") == 3

    run_coroutine(scenario())


async def _ran(jobs: Jobs, key: str, names: list[str]) -> None:
    """`names` run one after the other under `key`, each to its end."""
    for name in names:
        jobs.submit(key, name)
        await _settle()
        await jobs.finish(name)


async def _busy_a_behind_light_b(clock: Clock) -> Jobs:
    """4 threads; A has started 6 requests lately, B's first (b0) runs, and A's next (a6) is submitted."""
    jobs = Jobs(FairTurns(4, clock=clock))
    await _ran(jobs, "org:a", [f"a{i}" for i in range(6)])
    jobs.submit("org:b", "b0")
    await _settle()
    jobs.submit("org:a", "a6")
    await _settle()
    return jobs


def test_a_busy_tenant_waits_for_a_light_tenants_request_for_at_most_a_moment() -> None:
    """GIVEN 4 threads and tenant A having started 6 requests lately, B one: A's next request waits while B's runs
    (it starts as B's ends), B's starts at once while A's runs (B is the lighter), and a B request that runs past
    PRECEDENCE_S holds A no longer (a slow page of a light tenant does not stop a busy one)."""

    async def scenario() -> None:
        clock = Clock()
        jobs = await _busy_a_behind_light_b(clock)
        assert jobs.started[-1] == "b0" and jobs.turns.free == 3  # a thread free, and A waits for b0
        await jobs.finish("b0")
        assert jobs.started[-1] == "a6"
        jobs.submit("org:b", "b1")
        await _settle()
        assert jobs.started[-1] == "b1"  # beside A's request: B is the lighter
        await asyncio.sleep(PRECEDENCE_S + 0.05)  # no re-check pending: a7 waiting for its share sets one for later
        jobs.submit("org:a", "a7")
        await jobs.finish("a6")
        assert "a7" not in jobs.started  # b1 runs
        clock.now += PRECEDENCE_S + 0.01
        await asyncio.sleep(PRECEDENCE_S + 0.1)  # the re-check (a crowd's would come at CROWD_S / 4)
        assert jobs.started[-1] == "a7"  # b1 still runs, for longer than the precedence lasts
        await jobs.finish("b1")
        jobs.submit("ip:10.0.0.9", "x0")  # a request no credential has proved: it holds no tenant back
        jobs.submit("org:a", "a8")
        await jobs.finish("a7")
        assert jobs.started[-2:] == ["x0", "a8"]
        await jobs.finish("x0")
        await jobs.finish("a8")
        assert jobs.turns.free == 4 and not jobs.turns.running and not jobs.turns.turn

    run_coroutine(scenario())


def test_light_tenants_taking_turns_hold_a_busy_one_for_a_moment_in_all() -> None:
    """B's request holds A's; C's, started just before B's hold ends, holds A only for what is left of A's
    PRECEDENCE_S: A starts then, with C's request still within its own hold."""

    async def scenario() -> None:
        clock = Clock()
        jobs = await _busy_a_behind_light_b(clock)
        clock.now += PRECEDENCE_S * 0.8
        jobs.submit("org:c", "c0")
        await _settle()
        assert jobs.started[-1] == "c0" and "a6" not in jobs.started
        clock.now += PRECEDENCE_S * 0.3  # b0's hold and A's moment are over; c0's hold is not
        await asyncio.sleep(PRECEDENCE_S + 0.1)
        assert jobs.started[-1] == "a6"
        for name in ("b0", "c0", "a6"):
            await jobs.finish(name)
        assert jobs.turns.free == 4 and not jobs.turns._held_since

    run_coroutine(scenario())


def test_a_tenants_load_fades_by_e_every_crowd_s_and_is_forgotten_once_gone() -> None:
    async def scenario() -> None:
        clock = Clock()
        jobs = Jobs(FairTurns(4, clock=clock))
        await _ran(jobs, "org:a", ["a0", "a1"])
        assert jobs.turns.load("org:a") == pytest.approx(2)
        clock.now += CROWD_S / 2
        assert jobs.turns.load("org:a") == pytest.approx(2 * math.exp(-0.5))
        clock.now += CROWD_S
        jobs.turns.share_of("org:b")  # forgets what it saw over CROWD_S ago
        assert jobs.turns.load("org:a") == 0.0

    run_coroutine(scenario())


def test_tenants_about_as_busy_do_not_hold_each_other() -> None:
    """A with 3 recent requests, C with 2 (its second running): A's next starts beside C's at once."""

    async def scenario() -> None:
        clock = Clock()
        jobs = Jobs(FairTurns(4, clock=clock))
        await _ran(jobs, "org:a", ["a0", "a1", "a2"])
        await _ran(jobs, "org:c", ["c0"])
        jobs.submit("org:c", "c1")
        jobs.submit("org:a", "a3")
        await _settle()
        assert jobs.started[-2:] == ["c1", "a3"]
        assert jobs.turns.load("org:a") == pytest.approx(4) and jobs.turns.load("org:c") == pytest.approx(2)
        await jobs.finish("c1")
        await jobs.finish("a3")

    run_coroutine(scenario())


def test_tenants_waiting_together_take_turns() -> None:
    """GIVEN 2 threads (a share of 1), A queues 4 requests and then B 4: they start A, B, A, B, ..."""

    async def scenario() -> None:
        jobs = Jobs(FairTurns(2))
        for i in range(4):
            jobs.submit("org:a", f"a{i}")
        await _settle()
        for i in range(4):
            jobs.submit("org:b", f"b{i}")
        await _settle()
        while len(jobs.started) < 8:
            running = [n for n in jobs.started if not jobs.tasks[n].done()]
            await jobs.finish(running[0])
        assert jobs.started == ["a0", "b0", "a1", "b1", "a2", "b2", "a3", "b3"]

    run_coroutine(scenario())


def test_a_client_that_leaves_while_waiting_loses_no_thread() -> None:
    async def scenario() -> None:
        turns = FairTurns(2)
        jobs = Jobs(turns)
        for key, name in (("org:a", "a0"), ("org:b", "b0"), ("org:a", "a1"), ("org:c", "c0")):
            jobs.submit(key, name)
        await _settle()
        jobs.tasks["a1"].cancel()
        await _settle()
        assert list(turns.turn) == ["org:c"]
        await jobs.finish("a0")
        assert jobs.started[-1] == "c0"
        await jobs.finish("b0")
        await jobs.finish("c0")
        assert turns.free == 2 and not turns.running and not turns.turn and not turns.waiting

    run_coroutine(scenario())


def test_a_client_that_leaves_as_it_is_granted_passes_the_thread_on() -> None:
    async def scenario() -> None:
        turns = FairTurns(1)
        await turns._acquire("org:a")
        waiter = asyncio.ensure_future(turns._acquire("org:b"))
        await _settle()
        turns._release("org:a")  # grants b's turn; b's task has not run since
        waiter.cancel()
        await asyncio.gather(waiter, return_exceptions=True)
        assert turns.free == 1 and not turns.running and not turns.turn

    run_coroutine(scenario())


def test_requests_queue_under_the_org_their_credential_proved_else_under_their_address() -> None:
    turns = FairTurns(4)
    token_1 = [(b"authorization", b"Bearer spw_one")]
    token_2 = [(b"authorization", b"Bearer spw_two")]
    session = [(b"cookie", b"csrftoken=x; sessionid=abc")]
    assert turns.key(token_1, "10.0.0.1") == "ip:10.0.0.1"  # not proven yet
    turns.learn(token_1, "org:7")
    turns.learn(token_2, "org:7")
    turns.learn(session, "org:8")
    assert turns.key(token_1, "10.0.0.1") == turns.key(token_2, "10.0.0.2") == "org:7"  # one queue per org
    assert turns.key(session, "10.0.0.1") == "org:8"
    turns.learn(token_1, None)  # revoked, or its member removed: no longer the org's
    assert turns.key(token_1, "10.0.0.1") == "ip:10.0.0.1"
    assert turns.key([(b"authorization", b"Bearer made-up")], "10.0.0.9") == "ip:10.0.0.9"
    assert credential(token_1) != credential(token_2) and "spw_one" not in credential(token_1)


def test_what_the_server_remembers_is_bounded() -> None:
    turns = FairTurns(4)
    for i in range(LEARNED_MAX + 50):
        turns.learn([(b"authorization", f"Bearer t{i}".encode())], "org:1")
    assert len(turns._learned) == LEARNED_MAX
    assert turns.key([(b"authorization", b"Bearer t0")], "a") == "ip:a"  # the oldest went first
    assert turns.key([(b"authorization", f"Bearer t{LEARNED_MAX + 49}".encode())], "a") == "org:1"


@pytest.mark.parametrize("slots", [1, 2])
def test_one_thread_still_serves_everyone(slots: int) -> None:
    async def scenario() -> None:
        jobs = Jobs(FairTurns(slots))
        for i in range(3):
            jobs.submit("org:a", f"a{i}")
        for i in range(3):
            jobs.gates[f"a{i}"].set()
        assert await asyncio.gather(*jobs.tasks.values()) == ["a0", "a1", "a2"]

    run_coroutine(scenario())
