"""What both load modes share: run bounds, cancel, progress, timeouts, connecting, results.

A driver runs inside one event loop, single-threaded; every method here is called from a loop
callback, so no locking. Subclasses decide *when* requests are sent (open vs closed loop).
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
from collections.abc import Callable, Iterable
from time import perf_counter
from typing import Any

from .connection import HttpConnection, classify_connect_error, classify_lost
from .plan import LoadPlan, Step
from .results import ERROR_KINDS, NON_2XX, TIMEOUT, Progress, RunResult
from .stats import StepStats

log = logging.getLogger(__name__)

CancelHook = Callable[[], bool] | asyncio.Event | threading.Event
ProgressHook = Callable[[Progress], None]

HOUSEKEEP_INTERVAL_S = 0.05
PROGRESS_INTERVAL_S = 0.5
# First arrivals are planned a little in the future so setup work cannot make them late.
START_LEAD_S = 0.005
DEFAULT_CONNECT_TIMEOUT_S = 5.0


def _cancel_requested(cancel: CancelHook | None) -> bool:
    if cancel is None:
        return False
    if isinstance(cancel, asyncio.Event | threading.Event):
        return cancel.is_set()
    return bool(cancel())


class Driver:
    closed_loop = False

    def __init__(self, plan: LoadPlan, progress: ProgressHook | None, cancel: CancelHook | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.plan = plan
        self.request = plan.target.request_bytes()
        self.progress_hook = progress
        self.cancel_hook = cancel
        self.timeout_s = plan.target.timeout_s
        self.stats: list[StepStats] = []
        self.conns: set[HttpConnection] = set()
        self.issued = 0
        self.outstanding = 0
        self.stopping = False
        self.stopped_reason = "completed"
        self.abandoned = 0
        self.connections_opened = 0
        self.t0 = 0.0
        self.stop_t = float("inf")
        self.deadline_t = float("inf")
        self.drain_deadline_t = float("inf")
        self.window_idx = 0
        # Where 2xx completions land once the schedule is over (counted in no step's window).
        self._after_window = StepStats(-1, Step(duration_s=float("inf")), float("inf"))
        self.window: StepStats = self._after_window
        self.done: asyncio.Future[None] = self.loop.create_future()
        self._addr: tuple[Any, ...] = ()
        self._bug: BaseException | None = None
        self._last_progress_t = 0.0
        self._last_progress_ok = 0

    # --- lifecycle -----------------------------------------------------------------------------

    async def run(self) -> RunResult:
        infos = await self.loop.getaddrinfo(
            self.plan.target.host, self.plan.target.port, type=socket.SOCK_STREAM
        )
        self._addr = infos[0][4]
        start = perf_counter()
        self.t0 = start + START_LEAD_S
        self.deadline_t = start + self.plan.max_duration_s
        t = self.t0
        for i, step in enumerate(self.plan.steps):
            self.stats.append(StepStats(i, step, t))
            t += step.duration_s
        self.window = self.stats[0]
        self._last_progress_t = start
        previous_handler = self.loop.get_exception_handler()
        self.loop.set_exception_handler(self._on_loop_error)
        housekeeping = self.loop.call_later(HOUSEKEEP_INTERVAL_S, self._housekeep)
        try:
            self._start()
            await self.done
        finally:
            housekeeping.cancel()
            self.loop.set_exception_handler(previous_handler)
            self._shutdown()
        if self._bug is not None:
            raise RuntimeError("load engine failed") from self._bug
        end = perf_counter()
        stopped_t = min(self.stop_t, end)
        steps = [s.result(stopped_t, self.closed_loop) for s in self.stats if s.start_t < stopped_t]
        self._report_progress(end, final=True)
        return RunResult(
            mode=self.plan.mode,
            steps=steps,
            stopped_reason=self.stopped_reason,
            elapsed_s=end - start,
            connections_opened=self.connections_opened,
            abandoned=self.abandoned,
        )

    def _start(self) -> None:
        raise NotImplementedError

    def _shutdown(self) -> None:
        for conn in list(self.conns):
            conn.close()
        self.conns.clear()

    def begin_drain(self, reason: str = "completed") -> None:
        """Stop starting requests; finish when the outstanding ones are done or drain time is up."""
        if self.stopping:
            return
        now = perf_counter()
        self.stopping = True
        if reason != "completed":
            self.stopped_reason = reason
            self.stop_t = now
        self.drain_deadline_t = now + self.plan.effective_drain_s
        self._on_drain()
        if self.outstanding <= 0:
            self._finish()

    def _on_drain(self) -> None:
        """Subclass hook: release what is idle."""

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _hard_stop(self, reason: str | None, count_as: str | None) -> None:
        """End now. Outstanding requests become `count_as` errors, or are abandoned if None."""
        now = perf_counter()
        self.stopping = True
        if reason is not None:
            self.stopped_reason = reason
            self.stop_t = min(self.stop_t, now)
        for st in self._outstanding_steps():
            if count_as is None:
                self.abandoned += 1
            else:
                st.errors[count_as] += 1
        self.outstanding = 0
        self._finish()

    def _outstanding_steps(self) -> Iterable[StepStats]:
        return [c.stats for c in self.conns if c.stats is not None]

    def _on_loop_error(self, loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        exc = context.get("exception")
        if isinstance(exc, OSError):
            # Socket trouble is the target's doing and is already counted by kind.
            return
        # Anything else is a bug in the engine: stop instead of measuring garbage.
        loop.default_exception_handler(context)
        if self._bug is None:
            self._bug = exc if exc is not None else RuntimeError(context.get("message", "loop error"))
        self._finish()

    # --- periodic checks ---------------------------------------------------------------------

    def _housekeep(self) -> None:
        if self.done.done():
            return
        now = perf_counter()
        try:
            cancelled = _cancel_requested(self.cancel_hook)
        except Exception:
            log.exception("cancel hook failed; treating it as a cancel")
            cancelled = True
        if cancelled:
            self._hard_stop("cancelled", None)
            return
        if now >= self.deadline_t:
            self._hard_stop("max_duration", TIMEOUT)
            return
        if self.timeout_s is not None:
            self._expire(now - self.timeout_s)
        if self.stopping and now >= self.drain_deadline_t:
            self._hard_stop(None, TIMEOUT)
            return
        for st in self.stats:
            st.flush()
        if now - self._last_progress_t >= PROGRESS_INTERVAL_S:
            self._report_progress(now, final=False)
        self.loop.call_later(HOUSEKEEP_INTERVAL_S, self._housekeep)

    def _expire(self, limit_t: float) -> None:
        """Requests intended before `limit_t` and still unanswered are timeouts."""
        for conn in [c for c in self.conns if c.stats is not None and c.start_t < limit_t]:
            st = conn.stats
            conn.stats = None
            st.errors[TIMEOUT] += 1  # type: ignore[union-attr]
            conn.close()
            self._finished_one()

    def _report_progress(self, now: float, *, final: bool) -> None:
        if self.progress_hook is None:
            return
        ok = sum(s.ok for s in self.stats)
        errors = sum(sum(s.errors[k] for k in ERROR_KINDS) for s in self.stats)
        elapsed = now - self.t0
        interval = now - self._last_progress_t
        achieved = (ok - self._last_progress_ok) / interval if interval > 0 else 0.0
        self._last_progress_t, self._last_progress_ok = now, ok
        if final:
            percent = 100.0
        else:
            by_time = elapsed / self.plan.schedule_s if self.plan.schedule_s else 0.0
            by_count = self.issued / self.plan.max_requests
            percent = min(max(by_time, by_count) * 100.0, 99.9)
        index = next((s.index for s in self.stats if s.start_t <= now < s.end_t), len(self.stats) - 1)
        try:
            self.progress_hook(
                Progress(
                    percent=round(max(percent, 0.0), 1),
                    step_index=index,
                    step_count=len(self.stats),
                    elapsed_s=round(max(elapsed, 0.0), 3),
                    achieved_rate=round(achieved, 1),
                    sent=self.issued,
                    ok=ok,
                    errors=errors,
                )
            )
        except Exception:
            # A flaky reporter (say, a database hiccup) must not abort a test half-way.
            log.exception("progress callback failed")

    # --- shared request bookkeeping -------------------------------------------------------------

    def next_window(self, now: float) -> StepStats:
        """The step whose time window contains `now` (called only when the current one has ended)."""
        stats = self.stats
        i = self.window_idx
        while i < len(stats) and now >= stats[i].end_t:
            i += 1
        self.window_idx = i
        self.window = stats[i] if i < len(stats) else self._after_window
        return self.window

    def _record_response(self, conn: HttpConnection, status: int) -> bool:
        """Count a response against its request's step; False for an answer to no request."""
        now = perf_counter()
        st = conn.stats
        if st is None:
            conn.close()  # an answer to nothing: the connection is out of step
            return False
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
        return True

    def _finished_one(self) -> None:
        self.outstanding -= 1
        if self.stopping and self.outstanding <= 0:
            self._finish()

    def _fail(self, st: StepStats, kind: str) -> None:
        st.errors[kind] += 1
        self._finished_one()

    def _conn_factory(self) -> HttpConnection:
        return HttpConnection(self, self.request)

    async def connect(self) -> HttpConnection | str:
        """A new connection, or the error kind if it could not be made."""
        timeout_s = self.timeout_s if self.timeout_s is not None else DEFAULT_CONNECT_TIMEOUT_S
        timeout_s = max(min(timeout_s, self.deadline_t - perf_counter()), 0.001)
        try:
            async with asyncio.timeout(timeout_s):
                # The address was resolved once per run: no DNS lookup per connection.
                _, conn = await self.loop.create_connection(self._conn_factory, self._addr[0], self._addr[1])
        except (OSError, TimeoutError) as exc:
            return classify_connect_error(exc)
        self.connections_opened += 1
        if self.done.done():
            conn.close()
            return TIMEOUT
        self.conns.add(conn)
        return conn

    # --- ConnectionOwner --------------------------------------------------------------------------

    def on_failure(self, conn: HttpConnection, kind: str) -> None:
        st = conn.stats
        conn.stats = None
        conn.close()
        if st is not None:
            self._fail(st, kind)

    def on_lost(self, conn: HttpConnection, exc: Exception | None) -> None:
        self.conns.discard(conn)
        st = conn.stats
        if st is not None:
            conn.stats = None
            self._fail(st, classify_lost(conn, exc))
        self._after_lost(conn)

    def _after_lost(self, conn: HttpConnection) -> None:
        """Subclass hook: replace the connection if the mode needs one."""
