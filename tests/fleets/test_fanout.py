"""fanout.parallel: node work on the pool's threads, or in turn for local nodes, with a slow node handing off."""

from __future__ import annotations

import threading
import time

from apps.fleets import fanout


def _recording(slow: set[int], seen: dict[int, str]):  # type: ignore[no-untyped-def]
    def work(item: int) -> int:
        seen[item] = threading.current_thread().name
        if item in slow:
            time.sleep(fanout.IN_TURN_SLOW_S + 0.05)
        return item * 10

    return work


def test_work_in_turn_runs_in_the_calling_thread_in_order() -> None:
    seen: dict[int, str] = {}
    assert fanout.parallel(_recording(set(), seen), [1, 2, 3, 4], in_turn=True) == [10, 20, 30, 40]
    assert set(seen.values()) == {threading.current_thread().name}


def test_a_slow_item_in_turn_hands_the_rest_to_the_threads() -> None:
    """A local node whose HAProxy does not answer (its socket timeout, 2 s) must not make every node after it wait
    for it and then for each other: the ones after it go to the pool, and the answers keep their order."""
    seen: dict[int, str] = {}
    here = threading.current_thread().name
    assert fanout.parallel(_recording({2}, seen), [1, 2, 3, 4, 5], in_turn=True) == [10, 20, 30, 40, 50]
    assert seen[1] == seen[2] == here
    assert all(seen[i] != here and seen[i].startswith("spillway-nodes") for i in (3, 4, 5))


def test_on_this_host_only_when_every_node_is_local() -> None:
    class Node:
        def __init__(self, transport: str) -> None:
            self.transport = transport

    assert fanout.on_this_host([Node("local"), Node("local")])
    assert not fanout.on_this_host([Node("local"), Node("ssh")])


def test_a_thread_cap_holds_on_threads_and_after_a_slow_item_in_turn() -> None:
    """The enforcer reads SSH nodes 8 at a time at most; its local nodes in turn hand off to no more than that."""
    running, most, lock = [0], [0], threading.Lock()

    def work(item: int) -> int:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(fanout.IN_TURN_SLOW_S + 0.05 if item == 0 else 0.05)
        with lock:
            running[0] -= 1
        return item

    assert fanout.parallel(work, list(range(1, 9)), threads=2) == list(range(1, 9))
    assert most[0] == 2
    most[0] = 0
    assert fanout.parallel(work, list(range(9)), in_turn=True, threads=3) == list(range(9))
    assert most[0] == 3
    assert fanout.parallel(work, [], threads=2) == []
