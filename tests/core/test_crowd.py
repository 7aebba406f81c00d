"""What the web server's processes know together (controlplane/crowd.py): tenants seen by any process crowd the
others, and while crowded a tenant's requests run one at a time in the whole server, each process a real one here
(a forked child stands for the server's other worker)."""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable

import pytest

from controlplane.crowd import SLOTS, Crowd, key_hash
from controlplane.fairturns import ADDRESS_PREFIX, CROWD_S, FairTurns
from tests.core.test_fair_turns import run

FORK = multiprocessing.get_context("fork")


@pytest.fixture
def crowd_dir(tmp_path) -> str:
    return str(tmp_path)


def _in_child(target: Callable, *args) -> multiprocessing.Process:  # type: ignore[type-arg]
    child = FORK.Process(target=target, args=args, daemon=True)
    child.start()
    return child


def _see(directory: str, key: str) -> None:
    Crowd(directory).seen(key)


def _hold_lane(directory: str, key: str, held, release) -> None:  # type: ignore[no-untyped-def]
    crowd = Crowd(directory)
    crowd.seen("org:other")
    with crowd.lane(key):
        held.set()
        release.wait(30)


def test_a_tenant_seen_by_another_process_crowds_the_others_until_the_window_passes(crowd_dir) -> None:
    """GIVEN org:2 seen only by another process, THEN this process finds org:1 crowded and org:2 not (its own
    sighting never crowds it), and after CROWD_S nobody is."""
    child = _in_child(_see, crowd_dir, "org:2")
    child.join(30)
    assert child.exitcode == 0
    crowd = Crowd(crowd_dir)
    assert crowd.others_about("org:1", CROWD_S)
    assert not crowd.others_about("org:2", CROWD_S)
    later = Crowd(crowd_dir, clock=lambda: time.monotonic() + CROWD_S + 0.01)
    assert not later.others_about("org:1", CROWD_S)


def test_slots_are_by_tenant_so_a_crowd_of_tenants_fits() -> None:
    """Distinct tenants land in distinct slots often enough: 100 tenants take at least 95 slots of SLOTS."""
    assert len({key_hash(f"org:{i}") % SLOTS for i in range(100)}) >= 95


def test_fair_turns_hold_a_tenant_alone_in_this_process_to_one_thread_when_another_process_serves_another(
        crowd_dir) -> None:
    """GIVEN acme's requests only in this process and globex's only in the other, THEN acme gets one thread here,
    not all but one (each process knew only its own: the other kept running three of the busy tenant's requests)."""

    async def scenario() -> None:
        alone = FairTurns(4)
        shared = FairTurns(4, crowd=Crowd(crowd_dir))
        for turns in (alone, shared):
            await turns._acquire("org:acme")
            turns._release("org:acme")
        child = _in_child(_see, crowd_dir, "org:globex")
        child.join(30)
        assert alone.share_of("org:acme") == 3
        assert shared.share_of("org:acme") == 1

    run(scenario())


def test_a_tenants_lane_is_one_holder_in_the_whole_server_and_a_dead_holder_lets_it_go(crowd_dir) -> None:
    """GIVEN another process holding acme's lane, WHEN this one asks for it, THEN it waits until the other lets go;
    and a holder killed with the lane held frees it (flock goes with the process)."""
    crowd = Crowd(crowd_dir)
    for ending in ("release", "kill"):
        held, release = FORK.Event(), FORK.Event()
        child = _in_child(_hold_lane, crowd_dir, "org:acme", held, release)
        assert held.wait(30)
        got = threading.Event()

        def take(got: threading.Event = got) -> None:
            with crowd.lane("org:acme"):
                got.set()

        taker = threading.Thread(target=take, daemon=True)
        taker.start()
        with crowd.lane("org:globex"):  # another tenant's lane is free meanwhile
            pass
        assert not got.wait(0.3), "took acme's lane while another process held it"
        if ending == "release":
            release.set()
        else:
            os.kill(child.pid, signal.SIGKILL)
        assert got.wait(10), f"acme's lane not free after its holder's {ending}"
        taker.join(10)
        child.join(10)


@pytest.mark.django_db
def test_a_request_waits_for_its_tenants_lane_only_while_others_are_about(crowd_dir) -> None:
    """Through the served application's own turn (controlplane.asgi._run_turn, a real GET /healthz): GIVEN another
    process holding acme's lane, an acme request waits for it while another tenant was seen lately, and runs at
    once when acme is alone (a lone tenant keeps the whole server); an address's request never waits for a lane."""
    from controlplane import asgi

    scope = {"type": "http", "method": "GET", "path": "/healthz", "headers": [], "query_string": b"",
             "client": ("127.0.0.1", 5), "server": ("testserver", 80)}
    answers: list[int] = []

    def request(key: str = "org:acme") -> None:
        answers.append(asgi._run_turn(key, scope, b"")[0])

    directory = asgi._crowd.directory
    held, release = FORK.Event(), FORK.Event()
    child = _in_child(_hold_lane, directory, "org:acme", held, release)  # also sees org:other
    try:
        assert held.wait(30)
        waiting = threading.Thread(target=request, daemon=True)
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and not answers, "acme's request ran while another process held its lane"
        release.set()
        waiting.join(10)
        assert answers == [200]
    finally:
        release.set()
        child.join(10)

    # A credential not proved yet waits with its address (behind a proxy, every user's login): it keeps one at a
    # time per process and never waits for a lane, crowded or not.
    address = f"{ADDRESS_PREFIX}127.0.0.1"
    held, release = FORK.Event(), FORK.Event()
    child = _in_child(_hold_lane, directory, address, held, release)
    try:
        assert held.wait(30)
        assert asgi._crowd.others_about(address, CROWD_S)
        login = threading.Thread(target=request, args=(address,), daemon=True)
        login.start()
        login.join(10)
        assert answers == [200, 200]
    finally:
        release.set()
        child.join(10)

    # Alone: nobody else seen within CROWD_S (a fresh table), the lane is not asked for even while held.
    lonely = Crowd(crowd_dir)
    held, release = FORK.Event(), FORK.Event()
    saved = asgi._crowd
    asgi._crowd = lonely
    try:
        holder = _in_child(_hold_lane_quietly, crowd_dir, "org:acme", held, release)
        assert held.wait(30)
        alone = threading.Thread(target=request, daemon=True)  # its own connection, as a server thread has
        alone.start()
        alone.join(10)
        assert answers == [200, 200, 200]
    finally:
        asgi._crowd = saved
        release.set()
        holder.join(10)


def _hold_lane_quietly(directory: str, key: str, held, release) -> None:  # type: ignore[no-untyped-def]
    with Crowd(directory).lane(key):
        held.set()
        release.wait(30)
