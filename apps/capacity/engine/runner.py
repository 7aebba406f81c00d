"""Entry points: `run_plan` for synchronous callers (a Celery task), `run_plan_async` inside a loop."""

from __future__ import annotations

import asyncio
import concurrent.futures

import uvloop

from .closedloop import ClosedLoopDriver
from .driver import CancelHook, ProgressHook
from .openloop import OpenLoopDriver
from .plan import LoadPlan
from .results import RunResult


async def run_plan_async(
    plan: LoadPlan, progress: ProgressHook | None = None, cancel: CancelHook | None = None
) -> RunResult:
    driver_cls = OpenLoopDriver if plan.mode == "open" else ClosedLoopDriver
    return await driver_cls(plan, progress, cancel).run()


def run_plan(
    plan: LoadPlan, progress: ProgressHook | None = None, cancel: CancelHook | None = None
) -> RunResult:
    """Run a plan to completion in a fresh uvloop loop and return its results.

    Blocks for at most `plan.max_duration_s` (plus connection teardown). `progress` is called in
    this thread about every 0.5 s; `cancel` (a callable returning True, or an asyncio/threading
    Event) is checked every 50 ms and stops the run with `stopped_reason == "cancelled"`.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _run_in_fresh_loop(plan, progress, cancel)
    # Called from a thread that already runs a loop (e.g. next to Playwright's sync API):
    # run in a thread of our own so neither loop blocks or breaks the other.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(_run_in_fresh_loop, plan, progress, cancel).result()


def _run_in_fresh_loop(plan: LoadPlan, progress: ProgressHook | None, cancel: CancelHook | None) -> RunResult:
    loop = uvloop.new_event_loop()
    try:
        return loop.run_until_complete(run_plan_async(plan, progress, cancel))
    finally:
        loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()
