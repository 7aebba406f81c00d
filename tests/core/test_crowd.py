"""What the web server's processes know together (controlplane/crowd.py): tenants seen by any process crowd the
others, and while crowded a tenant's requests run one at a time in the whole server, waited for on the event loop
(controlplane.asgi._in_lane). Each process is a real one here: a forked child stands for the server's other worker,
and both read one clock set by hand."""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable

from controlplane.crowd import SLOTS, Crowd, key_hash
from controlplane.fairturns import ADDRESS_PREFIX, CROWD_S, FairTurns
from tests.waiting import run_coroutine

FORK = multiprocessing.get_context("fork")
AT = 1000.0  # the other process's sightings, on the clock both read


def at(now: float) -> Callable[[], float]:
    return lambda: now


def _in_child(target: Callable, *args) -> multiprocessing.Process:  # type: ignore[type-arg]
    child = FORK.Process(target=target, args=args, daemon=True)
    child.start()
    return child


def _see(directory: str, key: str) -> None:
    Crowd(directory, clock=at(AT)).seen(key)


def _hold_lane(directory: str, key: str, held, release, seen: str | None) -> None:  # type: ignore[no-untyped-def]
    crowd = Crowd(directory, clock=at(AT))
    if seen:
        crowd.seen(seen)
    while (fd := crowd.try_lane(key)) is None:  # the child holds it for the test: it is free when it starts
        time.sleep(0.002)
    try:
        held.set()
        release.wait(60)
    finally:
        crowd.leave(fd)


def _other_process_sees(directory: str, key: str) -> None:
    child = _in_child(_see, directory, key)
    child.join(30)
    assert child.exitcode == 0


def test_a_tenant_seen_by_another_process_crowds_the_others_until_the_window_passes(tmp_path) -> None:
    """GIVEN org:2 seen only by another process, THEN this process finds org:1 crowded and org:2 not (its own
    sighting never crowds it), and CROWD_S later nobody is."""
    _other_process_sees(str(tmp_path), "org:2")
    now = Crowd(str(tmp_path), clock=at(AT + 0.5))
    assert now.others_about("org:1", CROWD_S)
    assert not now.others_about("org:2", CROWD_S)
    assert not Crowd(str(tmp_path), clock=at(AT + CROWD_S + 0.01)).others_about("org:1", CROWD_S)


def test_slots_are_by_tenant_so_a_crowd_of_tenants_fits() -> None:
    """Distinct tenants land in distinct slots often enough: 100 tenants take at least 95 slots of SLOTS."""
    assert len({key_hash(f"org:{i}") % SLOTS for i in range(100)}) >= 95


def test_fair_turns_hold_a_tenant_alone_here_to_one_thread_when_another_process_serves_another(tmp_path) -> None:
    """GIVEN acme's requests only in this process and globex's only in the other, THEN acme gets one thread here,
    not all but one (each process knew only its own: the other kept running three of the busy tenant's requests);
    and a request of an address (no credential proved yet) is not published: it crowds no other process."""

    async def scenario() -> None:
        alone = FairTurns(4, clock=at(AT))
        shared = FairTurns(4, clock=at(AT), crowd=Crowd(str(tmp_path), clock=at(AT + 0.5)))
        for turns in (alone, shared):
            await turns._acquire("org:acme")
            turns._release("org:acme")
        assert alone.share_of("org:acme") == 3
        assert shared.share_of("org:acme") == 1

        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        probe = FairTurns(4, clock=at(AT), crowd=Crowd(str(elsewhere), clock=at(AT)))
        await probe._acquire(f"{ADDRESS_PREFIX}10.0.0.9")
        probe._release(f"{ADDRESS_PREFIX}10.0.0.9")
        await probe._acquire("org:initech")
        probe._release("org:initech")
        assert Crowd(str(elsewhere), clock=at(AT)).others_about("org:acme", CROWD_S)  # initech is published
        assert not Crowd(str(elsewhere), clock=at(AT)).others_about("org:initech", CROWD_S)  # the address is not

    _other_process_sees(str(tmp_path), "org:globex")  # forked here, not from the event loop's thread
    run_coroutine(scenario())


def test_a_tenants_lane_is_one_holder_in_the_whole_server_and_a_dead_holder_lets_it_go(tmp_path) -> None:
    """GIVEN another process holding acme's lane, THEN this one cannot take it (globex's is free) until the other
    lets go; and a holder killed with the lane held frees it (flock goes with the process)."""
    crowd = Crowd(str(tmp_path))
    for ending in ("release", "kill"):
        held, release = FORK.Event(), FORK.Event()
        child = _in_child(_hold_lane, str(tmp_path), "org:acme", held, release, None)
        assert held.wait(30)
        assert crowd.try_lane("org:acme") is None
        other = crowd.try_lane("org:globex")
        assert other is not None
        crowd.leave(other)
        if ending == "release":
            release.set()
        else:
            os.kill(child.pid, signal.SIGKILL)
        child.join(10)
        fd = crowd.try_lane("org:acme")
        assert fd is not None, f"acme's lane not free after its holder's {ending}"
        crowd.leave(fd)


class _Request:
    """A request's turn through asgi._in_lane on an event loop of its own thread; `ran_at`: when its job began."""

    def __init__(self, key: str) -> None:
        from controlplane import asgi

        self.ran_at: float | None = None
        self.done = threading.Event()

        async def job() -> str:
            self.ran_at = time.monotonic()
            return "answered"

        def serve() -> None:
            self.answer = asyncio.run(asgi._in_lane(key, job))
            self.done.set()

        threading.Thread(target=serve, daemon=True).start()


def test_a_request_waits_for_its_tenants_lane_on_the_event_loop_only_while_others_are_about(
        tmp_path, monkeypatch) -> None:
    """Through the web server's own lane step (controlplane.asgi._in_lane), GIVEN another process holding acme's lane
    and another tenant about: acme's request runs only once the other process lets go (and asks for no thread
    before: its job is the thread); alone, it runs at once; an address's request never waits for a lane; and a
    lane held past LANE_WAIT_S no longer holds the request."""
    from controlplane import asgi

    directory = str(tmp_path)
    monkeypatch.setattr(asgi, "_crowd", Crowd(directory, clock=at(AT + 0.5)))
    held, release = FORK.Event(), FORK.Event()
    holder = _in_child(_hold_lane, directory, "org:acme", held, release, "org:other")
    try:
        assert held.wait(30)
        waiting = _Request("org:acme")
        assert not waiting.done.wait(0.3)
        released_at = time.monotonic()
        release.set()
        assert waiting.done.wait(10)
        assert waiting.answer == "answered"
        assert waiting.ran_at is not None and waiting.ran_at >= released_at, "ran while another process held its lane"
    finally:
        release.set()
        holder.join(10)

    release = FORK.Event()
    address = f"{ADDRESS_PREFIX}127.0.0.1"
    holding = {key: FORK.Event() for key in (address, "org:acme")}
    holders = [_in_child(_hold_lane, directory, key, held, release, "org:other") for key, held in holding.items()]
    try:
        assert all(held.wait(30) for held in holding.values())
        login = _Request(address)  # crowded, its "lane" held elsewhere: runs at once all the same
        assert login.done.wait(10)
        monkeypatch.setattr(asgi, "_crowd", Crowd(directory, clock=at(AT + CROWD_S + 1)))  # org:other long gone
        lone = _Request("org:acme")
        assert lone.done.wait(10), "a tenant alone waited for its lane"
        monkeypatch.setattr(asgi, "_crowd", Crowd(directory, clock=at(AT + 0.5)))
        monkeypatch.setattr(asgi, "LANE_WAIT_S", 0.3)
        asked_at = time.monotonic()
        stuck = _Request("org:acme")
        assert stuck.done.wait(10), "a request waited for a stuck lane without end"
        assert stuck.ran_at is not None and stuck.ran_at - asked_at >= 0.3  # it did wait, then ran beside the holder
    finally:
        release.set()
        for child in holders:
            child.join(10)
    assert not asgi._local_lanes, "a tenant's local lane outlived its requests"
