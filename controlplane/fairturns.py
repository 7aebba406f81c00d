"""Fair turns at the web server's request threads: one queue per tenant, served in turn.

Without it the thread pool is first come, first served: a tenant that sends 500 writes at once queues them
all ahead of everyone else's next request, and another tenant's write waits for the whole burst (bench-tenants
--sizes small: a quiet tenant's create p50 24 ms alone, 245 ms beside one tenant's 3,000/min + 500 at once).
Here a request waits for a thread in its tenant's queue; a freed thread goes to the waiting tenant that runs
the fewest requests (of those, the one waiting longest), and no tenant holds more than all threads but one (one
while others are about: below), so a quiet tenant's request finds a thread free however long the others' queues
(one tenant's requests beyond that wait their turn: a burst of writes to one LB runs one at a time behind its lock
anyway, so a fourth thread would only wait there).

Who a request belongs to is known only once it ran (the token or session names an org): the server learns
"this credential is org N" from each answered request (`learn`) and queues later ones under the org, so a
tenant's many tokens share one queue. A credential not seen yet waits in its client address's queue, so
a flood of made-up tokens is one more tenant in the rotation, not a thousand.

Turns share threads, not cores: a process runs one thread of Python at a time, and a tenant's three running requests
took the cores from the quiet tenant's one even with a thread free for it. So while the room is crowded — another
tenant has a request running or waiting, or had one in the last CROWD_S — a tenant runs one request at a time in this
process; alone, it may take all threads but one. bench-tenants --sizes small on 2 cores, beside another tenant's
3,000 writes a minute and 500 at once: the quiet tenant's create p50 32-43 ms instead of 38-52 (19-27 alone), over 8
and 6 runs; its p99 over its p99 alone (1.6-4.9 against 3.3-5.1) is not reliably lower. The busy tenant's writes were
answered at the same rate either way (one at a time behind its LB's lock). The p99 tails were full garbage
collections of the whole application, every thread waiting (the web process now freezes its startup heap,
apps.core.gcpause: ratio 1.7-2.1); what is left is the other process's request and PostgreSQL's share of the cores.
With a `crowd` (controlplane.crowd), "another tenant" is one any process of the server saw, not only this one.

One at a time still let the busy tenant's next request start the moment its last one ended, beside the quiet
tenant's request already running, whose time then went half to it. So a tenant that started at least HEAVIER times
as many requests lately as one running here (starts, each weighing less as it ages, by e every CROWD_S) waits for
that request to end, for at most PRECEDENCE_S in all, however many lighter tenants take turns; the lighter tenant's
request starts beside the busy one's as before. A tenant's requests take one server-wide lane while crowded
(controlplane/asgi.py), so a hold in one process holds its next request in the others too, as a wait for its share
already did. bench-tenants --sizes small --noisy-seconds 60 --rounds 3, alternating (2026-11-28, 2 cores): the quiet
tenant's create p50 beside the busy one over its p50 alone 1.12-1.15 in 4 runs against 1.26 in 4, p95 1.19-1.35
against 1.28-1.50; the p99 ratio 1.19-1.50 against 1.33-1.59 (not reliably lower: the machine's stalls); the busy
tenant answered at 3,392-3,910 writes a minute against 3,521-3,825.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from controlplane.crowd import Crowd

T = TypeVar("T")

LEARNED_MAX = 10_000  # credentials remembered per process (least recently used dropped)
ADDRESS_PREFIX = "ip:"  # the key of a request whose credential no answered request has proved yet
CROWD_S = 1.0  # another tenant's request started or ended this recently: the room is still crowded
# Precedence of the lighter tenant: a tenant that started at least HEAVIER times as many requests lately (decayed over
# CROWD_S) as one running here waits for that one's request to end before starting one of its own, for at most
# PRECEDENCE_S a request in all (a slow page of a light tenant, or many light tenants in turn, hold it no longer).
HEAVIER = 2.0
PRECEDENCE_S = 0.1


def credential(headers: list[tuple[bytes, bytes]], session_cookie: bytes = b"sessionid") -> str | None:
    """A stable, non-reversible key for the credential a request carries (bearer token or session), or None."""
    for name, value in headers:
        if name == b"authorization" and value:
            return "a:" + hashlib.blake2b(value, digest_size=12).hexdigest()
    for name, value in headers:
        if name == b"cookie":
            for part in value.split(b";"):
                key, _, cookie = part.strip().partition(b"=")
                if key == session_cookie and cookie:
                    return "s:" + hashlib.blake2b(cookie, digest_size=12).hexdigest()
    return None


class FairTurns:
    """`slots` concurrent runs shared in turn between keys (tenants); `await run(key, job)`."""

    def __init__(self, slots: int, clock: Callable[[], float] = time.monotonic, crowd: Crowd | None = None) -> None:
        self.slots = slots
        self.crowd = crowd  # what the server's other processes saw (controlplane.crowd)
        self.free = slots
        self.share = max(1, slots - 1)  # alone: one thread stays for everyone else
        self.running: dict[str, int] = {}
        self.waiting: dict[str, deque[asyncio.Future[None]]] = {}
        self.turn: deque[str] = deque()  # keys with waiters, longest waiting first
        self._learned: OrderedDict[str, str] = OrderedDict()
        self._clock = clock
        self._seen: OrderedDict[str, float] = OrderedDict()  # key -> its last start or end, oldest first
        self._load: dict[str, tuple[float, float]] = {}  # key -> (starts, decayed over CROWD_S, as of when)
        self._ahead_until: dict[str, float] = {}  # running key -> until when a heavier key waits for it
        self._held_since: dict[str, float] = {}  # waiting key -> since when lighter keys hold its next request
        # The pending re-check and the loop it is on: a handle left on a closed loop must not stand for one pending.
        self._regrant: tuple[asyncio.AbstractEventLoop, asyncio.TimerHandle] | None = None

    def share_of(self, key: str) -> int:
        """Threads `key` may hold now: one while another tenant is about, else all but one."""
        self._forget_seen()
        return self._share(key)

    def _share(self, key: str) -> int:
        """share_of once expired sightings are forgotten (_grant forgets them once for all its keys)."""
        return 1 if self._others_about(key) else self.share

    def _forget_seen(self) -> None:
        horizon = self._clock() - CROWD_S
        while self._seen:
            key, at = next(iter(self._seen.items()))
            if at > horizon:
                break
            del self._seen[key]
            if key not in self.running:
                self._load.pop(key, None)  # seen again later, it starts from nothing, as a new tenant does

    def _others_about(self, key: str) -> bool:
        """Another key runs, waits, or was seen within CROWD_S (after _forget_seen)."""
        return (len(self._seen) > (key in self._seen) or len(self.running) > (key in self.running)
                or len(self.turn) > (key in self.turn)
                or (self.crowd is not None and self.crowd.others_about(key, CROWD_S)))

    def load(self, key: str) -> float:
        """Requests `key` started lately, each counting less as it ages (by e every CROWD_S)."""
        value, at = self._load.get(key, (0.0, 0.0))
        return value * math.exp(-(self._clock() - at) / CROWD_S) if value else 0.0

    def _held_until(self, key: str) -> float:
        """0.0 when `key` may start now; else when to look again (the turns' clock): the first end of a hold on it.
        `key` is held by a running request of a key it is HEAVIER than, started less than PRECEDENCE_S ago, and for
        PRECEDENCE_S at most in all, however many lighter keys take turns (ten quiet tenants must not cut a busy one
        to a few requests a second). An address's request holds no one: no credential has proved it yet (a flood of
        made-up tokens from many addresses). The first call that finds `key` held starts its PRECEDENCE_S (_held_since);
        its next start, or its leaving the turn, clears it."""
        if len(self.running) <= (key in self.running):
            return 0.0
        now, mine = self._clock(), self.load(key)
        ends = [self._ahead_until[other] for other in self.running
                if other != key and not other.startswith(ADDRESS_PREFIX) and self._ahead_until[other] > now
                and self.load(other) * HEAVIER <= mine]
        if not ends:
            return 0.0
        last = self._held_since.setdefault(key, now) + PRECEDENCE_S
        return 0.0 if now >= last else min(*ends, last)

    def _touch(self, key: str) -> None:
        self._seen[key] = self._clock()
        self._seen.move_to_end(key)
        if self.crowd is not None and not key.startswith(ADDRESS_PREFIX):
            self.crowd.seen(key)  # an address's requests are not a tenant's: they crowd this process only

    def key(self, headers: list[tuple[bytes, bytes]], client: str) -> str:
        cred = credential(headers)
        if cred is not None and cred in self._learned:
            self._learned.move_to_end(cred)
            return self._learned[cred]
        return ADDRESS_PREFIX + client

    def learn(self, headers: list[tuple[bytes, bytes]], tenant: str | None) -> None:
        cred = credential(headers)
        if cred is None:
            return
        if tenant is None:
            self._learned.pop(cred, None)  # revoked, or its member removed: back to the address's queue
            return
        self._learned[cred] = tenant
        self._learned.move_to_end(cred)
        while len(self._learned) > LEARNED_MAX:
            self._learned.popitem(last=False)

    async def run(self, key: str, job: Callable[[], Awaitable[T]]) -> T:
        await self._acquire(key)
        try:
            return await job()
        finally:
            self._release(key)

    async def _acquire(self, key: str) -> None:
        if not self.turn and self.free > 0 and self.running.get(key, 0) < self.share_of(key) \
                and not self._held_until(key):
            self._start(key)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue = self.waiting.setdefault(key, deque())
        queue.append(future)
        if key not in self.turn:
            self.turn.append(key)
        self._grant()
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release(key)  # granted as the client left: pass the thread on
            else:
                self._forget(key, future)
            raise

    def _start(self, key: str) -> None:
        self.free -= 1
        self.running[key] = self.running.get(key, 0) + 1
        now = self._clock()
        self._load[key] = (self.load(key) + 1.0, now)
        self._ahead_until[key] = now + PRECEDENCE_S
        self._held_since.pop(key, None)
        self._touch(key)

    def _release(self, key: str) -> None:
        self.free += 1
        self._touch(key)
        left = self.running[key] - 1
        if left:
            self.running[key] = left
        else:
            del self.running[key]
            del self._ahead_until[key]
        self._grant()

    def _grant(self) -> None:
        """Hand free threads to waiting keys: the one running fewest first (the longest waiting of those), never
        to a key that holds its share. Threads left free while keys wait for the crowd to pass are handed out
        once it has (a re-check every quarter of CROWD_S: nothing else may happen meanwhile)."""
        self._forget_seen()
        while self.free > 0:
            holds = {k: self._held_until(k) for k in self.turn if self.running.get(k, 0) < self._share(k)}
            ready = [k for k, until in holds.items() if not until]
            if not ready:
                loop = asyncio.get_running_loop()
                # Held by lighter keys: look again as the first hold ends (a few ms late: uvloop's clock counts whole
                # milliseconds, and a look a moment early would find the hold still standing and wait once more);
                # waiting for the crowd to pass: every quarter of CROWD_S.
                due = loop.time() + (max(0.0, min(holds.values()) - self._clock()) + 0.002 if holds else CROWD_S / 4)
                pending = self._regrant
                if self.turn and (pending is None or pending[0] is not loop or pending[1].when() > due):
                    if pending is not None and pending[0] is loop:
                        pending[1].cancel()  # a later re-check for the crowd: the precedence ends sooner
                    self._regrant = (loop, loop.call_at(due, self._regranted))
                return
            key = min(ready, key=lambda k: self.running.get(k, 0))
            self.turn.remove(key)
            queue = self.waiting[key]
            future = queue.popleft()
            if queue:
                self.turn.append(key)
            else:
                del self.waiting[key]
            if not future.done():  # done: its client left, and its task has yet to run `_forget`
                self._start(key)
                future.set_result(None)

    def _regranted(self) -> None:
        self._regrant = None
        self._grant()

    def _forget(self, key: str, future: asyncio.Future[None]) -> None:
        queue = self.waiting.get(key)
        if queue is None:
            return
        try:
            queue.remove(future)
        except ValueError:
            return
        if not queue:
            del self.waiting[key]
            self.turn.remove(key)
            self._held_since.pop(key, None)
