"""Open loop: requests leave at their planned times whatever the target does.

Every request has an *intended* send time from the plan, and its latency is measured from that
time, not from when it actually left. If all connections are busy (the target stalls) and
max_connections is reached, the request waits in a FIFO for the next free connection and the wait
counts as latency. That is what keeps a stall visible: a closed-loop client would simply stop
sending during it and record one slow request (coordinated omission).
"""

from __future__ import annotations

from collections import deque
from time import perf_counter

from .connection import HttpConnection
from .driver import Driver
from .plan import arrival_offset_s
from .results import NON_2XX, TIMEOUT
from .stats import StepStats

# uvloop timers have 1 ms resolution and fire up to ~1 ms late, which would add up to a
# millisecond to every latency measured from the intended time. So the scheduler sleeps until
# shortly before the next arrival and polls the loop (still serving I/O) for the last stretch.
SPIN_WINDOW_S = 0.0015


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
        if delay > SPIN_WINDOW_S:
            self.loop.call_later(delay - SPIN_WINDOW_S, self._tick)
        else:
            self.loop.call_soon(self._tick)

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
            self.idle.pop().send(intended_t, st)
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
        now = perf_counter()
        st = conn.stats
        if st is None:
            conn.close()  # an answer to nothing: the connection is out of step
            return
        conn.stats = None
        if 200 <= status < 300:
            st.ok += 1
            st.latencies_us.append(int((now - conn.start_t) * 1_000_000))
            window = self.window
            if now >= window.end_t:
                window = self.next_window(now)
            window.window_ok += 1
        else:
            st.errors[NON_2XX] += 1
        if keep_alive:
            self._release(conn)
        else:
            conn.close()
        self.outstanding -= 1
        if self.stopping and self.outstanding <= 0:
            self._finish()

    def _after_lost(self, conn: HttpConnection) -> None:
        if conn in self.idle:
            self.idle.remove(conn)
        if self.pending and not self.done.done():
            self._open_if_needed()
