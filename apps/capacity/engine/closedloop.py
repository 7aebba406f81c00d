"""Closed loop: N users, each sending its next request when the last one finishes (like siege).

Each user is one keep-alive connection; the whole request cycle runs in protocol callbacks, so a
response triggers the next write without a coroutine switch. Latency is measured from the actual
send: a closed loop cannot know when a request *should* have left, which is exactly why it hides a
stall (one slow request per user instead of every request planned during the stall).
"""

from __future__ import annotations

from time import perf_counter

from .connection import HttpConnection
from .driver import Driver

# A user whose connect fails waits at least this long before retrying, so a dead target is
# reported as errors instead of becoming a connect flood.
RECONNECT_BACKOFF_S = 0.01
# The max_rate gate lets this much burst through before pacing (GCRA tolerance).
RATE_BURST_S = 0.05


class ClosedLoopDriver(Driver):
    closed_loop = True

    def _start(self) -> None:
        self.active_users = 0
        self.excess_users = 0
        self.cur = self.stats[0]
        self.think_s = self.plan.think_time_s
        self.rate_interval_s = 1.0 / self.plan.max_rate
        self.rate_tat = 0.0
        now = perf_counter()
        for st in self.stats[1:]:
            self.loop.call_later(max(st.start_t - now, 0.0), self._enter_step, st.index)
        self.loop.call_later(max(self.stats[-1].end_t - now, 0.0), self.begin_drain, "completed")
        self.loop.call_later(max(self.t0 - now, 0.0), self._enter_step, 0)

    def _enter_step(self, index: int) -> None:
        if self.stopping:
            return
        self.cur = self.stats[index]
        wanted = self.cur.step.users
        if wanted > self.active_users:
            self.excess_users = 0
            for _ in range(wanted - self.active_users):
                self.active_users += 1
                self.loop.create_task(self._user_connect())
        else:
            self.excess_users = self.active_users - wanted

    async def _user_connect(self) -> None:
        result = await self.connect()
        if not isinstance(result, str):
            self._next(result)
            return
        if self.stopping:
            self.active_users -= 1
            return
        # A failed connect is a failed request for the user who wanted to send one.
        st = self.cur
        self.issued += 1
        st.sent += 1
        st.errors[result] += 1
        if self.issued >= self.plan.max_requests:
            self.active_users -= 1
            self.begin_drain("max_requests")
            return
        self.loop.call_later(max(self.think_s, RECONNECT_BACKOFF_S), self._respawn)

    def _respawn(self) -> None:
        if self.stopping:
            self.active_users -= 1
            return
        if self.excess_users > 0:
            self.excess_users -= 1
            self.active_users -= 1
            return
        self.loop.create_task(self._user_connect())

    def _retire(self, conn: HttpConnection) -> None:
        conn.retired = True
        self.active_users -= 1
        conn.close()

    def _next(self, conn: HttpConnection) -> None:
        """The user behind `conn` is free: leave, think, or send."""
        if self.stopping:
            self._retire(conn)
        elif self.excess_users > 0:
            self.excess_users -= 1
            self._retire(conn)
        elif self.think_s > 0:
            self.loop.call_later(self.think_s, self._send, conn)
        else:
            self._send(conn)

    def _send(self, conn: HttpConnection) -> None:
        if conn.closed:
            return  # lost while thinking; _after_lost already replaced it
        if self.stopping:
            self._retire(conn)
            return
        if self.issued >= self.plan.max_requests:
            self._retire(conn)
            self.begin_drain("max_requests")
            return
        now = perf_counter()
        tat = self.rate_tat
        if tat - now > RATE_BURST_S:
            self.loop.call_later(tat - now - RATE_BURST_S, self._send, conn)
            return
        self.rate_tat = (tat if tat > now else now) + self.rate_interval_s
        self.issued += 1
        self.outstanding += 1
        st = self.cur
        st.sent += 1
        conn.send(now, st)

    def _on_drain(self) -> None:
        for conn in list(self.conns):
            if conn.stats is None:
                self._retire(conn)

    # --- ConnectionOwner --------------------------------------------------------------------------

    def on_response(self, conn: HttpConnection, status: int, keep_alive: bool) -> None:
        if not self._record_response(conn, status):
            return
        self._finished_one()
        if keep_alive:
            self._next(conn)
        else:
            conn.close()  # _after_lost reconnects this user

    def _after_lost(self, conn: HttpConnection) -> None:
        if conn.retired:
            return
        if self.stopping or self.done.done():
            self.active_users -= 1
            return
        if self.excess_users > 0:
            self.excess_users -= 1
            self.active_users -= 1
            return
        self.loop.create_task(self._user_connect())
