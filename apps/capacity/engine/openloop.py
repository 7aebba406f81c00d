"""Open loop: requests leave at their planned times whatever the target does.

Every request has an *intended* send time from the plan. A request that finds an idle connection
goes out at once and is timed from that send. A request that has to wait (for a new connection to
open, or, once max_connections is reached, for a busy one to free up) waits in a FIFO and is
timed from its *intended* send time, so the wait counts as latency. That is what keeps a stall
visible: a closed-loop client would simply stop sending during it and record one slow request
(coordinated omission).

The scheduler sleeps between arrivals (uvloop timers, 1 ms resolution), so sends may leave up to
about a millisecond late; at high rates several go out per wake-up. It deliberately does not spin
for sub-millisecond precision: a busy-polling client on a shared machine gets preempted for whole
scheduler slices and then charges those to the target, while a sleeping one is woken promptly.
Sends later than LATE_SEND_S (the engine itself fell behind) are counted in `late_sends`.
"""

from __future__ import annotations

from collections import deque
from time import perf_counter

from .connection import HttpConnection
from .driver import Driver
from .plan import arrival_offset_s
from .results import TIMEOUT
from .stats import StepStats

# Shorter sleeps round to 0 ms in uvloop and would turn the scheduler into a busy loop.
MIN_SLEEP_S = 0.001
LATE_SEND_S = 0.005


class OpenLoopDriver(Driver):
    closed_loop = False

    def _start(self) -> None:
        self.idle: list[HttpConnection] = []
        self.pending: deque[tuple[float, StepStats]] = deque()
        self.connecting = 0
        self.phase = 0
        self.k = -1
        self.cur = self.stats[0]
        self.next_t = 0.0
        if self._advance():
            self._arm()
        else:
            self._end_schedule()

    # --- the schedule --------------------------------------------------------------------------

    def _advance(self) -> bool:
        """Move to the next planned arrival; False when the plan has no more."""
        self.k += 1
        stats = self.stats
        while self.phase < len(stats):
            st = stats[self.phase]
            step = st.step
            offset = arrival_offset_s(step.rate, step.final_rate, step.duration_s, self.k)
            if offset is not None:
                self.next_t = st.start_t + offset
                self.cur = st
                return True
            self.phase += 1
            self.k = 0
        return False

    def _end_schedule(self) -> None:
        delay = self.stats[-1].end_t - perf_counter()
        self.loop.call_later(max(delay, 0.0), self.begin_drain, "completed")

    def _arm(self) -> None:
        delay = self.next_t - perf_counter()
        self.loop.call_later(delay if delay > MIN_SLEEP_S else MIN_SLEEP_S, self._tick)

    def _tick(self) -> None:
        if self.stopping:
            return
        now = perf_counter()
        max_requests = self.plan.max_requests
        # After a pause (GC, a slow callback) this sends the whole backlog at once, each request
        # still timed from its own intended time.
        while self.next_t <= now:
            if self.issued >= max_requests:
                self.begin_drain("max_requests")
                return
            self._dispatch(self.next_t, self.cur)
            if not self._advance():
                self._end_schedule()
                return
        self._arm()

    def _dispatch(self, intended_t: float, st: StepStats) -> None:
        self.issued += 1
        self.outstanding += 1
        st.sent += 1
        if self.idle:
            now = perf_counter()
            if now - intended_t > LATE_SEND_S:
                st.late_sends += 1
            self.idle.pop().send(now, st)
            return
        self.pending.append((intended_t, st))
        if len(self.conns) + self.connecting < self.plan.max_connections:
            self._open_if_needed()
        else:
            st.pool_exhausted += 1

    # --- connections ---------------------------------------------------------------------------

    def _open_if_needed(self) -> None:
        # One new connection per waiting request not already covered by a connect in progress.
        while (
            len(self.pending) > self.connecting
            and len(self.conns) + self.connecting < self.plan.max_connections
        ):
            self.connecting += 1
            self.loop.create_task(self._open())

    async def _open(self) -> None:
        result = await self.connect()
        self.connecting -= 1
        if isinstance(result, str):
            # The request this connection was opened for fails with the connect error.
            if self.pending and not self.done.done():
                _, st = self.pending.popleft()
                self._fail(st, result)
            return
        self._release(result)

    def _release(self, conn: HttpConnection) -> None:
        if conn.closed:
            return
        if self.pending:
            intended_t, st = self.pending.popleft()
            conn.send(intended_t, st)
        elif self.stopping:
            conn.close()
        else:
            self.idle.append(conn)

    def _on_drain(self) -> None:
        for conn in self.idle:
            conn.close()
        self.idle.clear()

    def _outstanding_steps(self) -> list[StepStats]:
        steps = [c.stats for c in self.conns if c.stats is not None]
        steps.extend(st for _, st in self.pending)
        self.pending.clear()
        return steps

    def _expire(self, limit_t: float) -> None:
        super()._expire(limit_t)
        pending = self.pending
        while pending and pending[0][0] < limit_t:
            _, st = pending.popleft()
            st.errors[TIMEOUT] += 1
            self._finished_one()

    # --- ConnectionOwner --------------------------------------------------------------------------

    def on_response(self, conn: HttpConnection, status: int, keep_alive: bool) -> None:
        if not self._record_response(conn, status):
            return
        if keep_alive:
            self._release(conn)
        else:
            conn.close()
        self._finished_one()

    def _after_lost(self, conn: HttpConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        if self.pending and not self.done.done():
            self._open_if_needed()
