"""The web server's application: what `make run` and production serve (`gunicorn -k asgi`, see
apps/core/webserver.py).

Why not Django's ASGI handler: our API is synchronous, and under that handler every sync view runs on
one thread per process (thread_sensitive), so one slow request would stall the process. Here every
request runs the ordinary WSGI application (controlplane.wsgi) on a pool of WEB_THREADS threads, each
with its own database connection — exactly as gunicorn's gthread worker did — and the one thing that
changes is *waiting*:

A view that would block (the `applied` long-poll) is told by ``environ["spillway.park"] == "ok"`` that
it may park instead; it then answers at once with ``X-Spillway-Park: <seconds>``. We keep the client's
connection open in a coroutine (no thread), woken by a Redis message (apps.core.wakeups) or every
LONGPOLL_RECHECK_S, and run the same request again with ``"spillway.park" == "recheck"`` (no throttle
charge; the view answers with X-Spillway-Park again while it is not done) until it is done or its time
is up, then send the last answer. Each re-check goes through the whole middleware
and DRF stack again, so authentication, tenancy (a foreign or deleted object is a 404) and a revoked
token end a wait exactly as they answer any request. A client cannot set these environ keys: request
headers only ever become ``HTTP_*`` keys, and the X-Spillway-Park* headers never leave this module.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import logging
import os
import random
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

from django.conf import settings
from django.urls import get_resolver

from apps.core import gcpause
from apps.core.webserver import TENANT_ENVIRON
from controlplane.crowd import Crowd, server_dir
from controlplane.fairturns import ADDRESS_PREFIX, CROWD_S, FairTurns
from controlplane.wsgi import application as wsgi_application

log = logging.getLogger(__name__)
T = TypeVar("T")

# A request waits this long at most for its tenant's lane (controlplane.crowd), polling it at most this far apart.
LANE_WAIT_S, LANE_POLL_MAX_S = 2.0, 0.005
PARK_HEADER = "x-spillway-park"  # seconds the view allows the request to wait
RELEASE_HEADER = "x-spillway-park-release"  # cache key of the principal's waiting count
MAX_BODY = 16 * 1024 * 1024

_pool = ThreadPoolExecutor(max_workers=settings.WEB_THREADS, thread_name_prefix="web")
# Who gets the next of those threads: each tenant in turn, not first come first served (controlplane.fairturns).
_db = settings.DATABASES["default"]
_crowd = Crowd(server_dir(str(settings.VAR_DIR), f"{_db.get('HOST')}:{_db.get('PORT')}/{_db['NAME']}"))
_turns = FairTurns(settings.WEB_THREADS, crowd=_crowd)
# Re-checks of parked requests run on their own thread, so a crowd of them woken together waits its
# turn there instead of queueing ahead of everyone else's requests in `_pool`.
_recheck_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="recheck")
_parked = 0


async def application(scope: dict[str, Any], receive, send) -> None:
    if scope["type"] == "lifespan":
        await _lifespan(receive, send)
    elif scope["type"] == "http":
        await _http(scope, receive, send)
    # websocket: unsupported; returning closes the connection.


def _started() -> None:
    """Once the server starts serving this process (ASGI lifespan startup: gunicorn's asgi worker sends it after the
    fork; importing this module, as tests do, freezes nothing): every view and serializer module imported now
    rather than on the first request, and the heap frozen with them, so that a full garbage collection walks what
    requests build, not the whole application (54 -> 0-2 ms, every request thread of the process waiting meanwhile:
    apps.core.gcpause)."""
    get_resolver().url_patterns  # noqa: B018
    gcpause.install()
    gcpause.freeze_startup_heap()


async def _lifespan(receive, send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            _started()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _http(scope: dict[str, Any], receive, send) -> None:
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if len(body) > MAX_BODY:
            await _send(send, 413, [(b"content-type", b"application/json")],
                        b'{"code":"too_large","detail":"Request body too large."}')
            return
        if not message.get("more_body"):
            break
    loop = asyncio.get_running_loop()
    # Taken before the view looks: a node recorded between its look and our parking still wakes us.
    seen = _wakeups.mark()
    key = _turns.key(scope["headers"], str((scope.get("client") or ("", 0))[0]))
    status, headers, content, tenant = await _in_lane(key, lambda: _turns.run(
        key, lambda: loop.run_in_executor(_pool, _run_wsgi, scope, bytes(body), "ok")))
    _turns.learn(scope["headers"], tenant)
    park = _header(headers, PARK_HEADER)
    release = _header(headers, RELEASE_HEADER)
    if park is None:
        await _send(send, status, headers, content)
        return
    global _parked
    try:
        if _parked >= settings.LONGPOLL_PARKED_PER_PROCESS:
            # Full: the answer already in hand is the "timeout passed" state; come back in a second.
            await _send(send, status, [*headers, (b"retry-after", b"1")], content)
            return
        _parked += 1
        try:
            answer = await _park(scope, bytes(body), float(park), receive, seen)
        finally:
            _parked -= 1
        if answer is not None:
            await _send(send, *answer)
    finally:
        if release:
            await loop.run_in_executor(None, _release, release)


async def _park(scope: dict[str, Any], body: bytes, seconds: float, receive, seen: int):
    """Wait up to `seconds`, re-asking the view on every wake-up; None if the client went away. `seen`:
    the wake-up count before the view last looked (a wake-up since then re-asks at once)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    disconnect = asyncio.ensure_future(_disconnected(receive))
    try:
        while True:
            remaining = deadline - loop.time()
            if remaining > 0:
                # Spread the periodic re-checks so a crowd parked together does not re-check together.
                recheck = settings.LONGPOLL_RECHECK_S * random.uniform(0.8, 1.2)
                wake = asyncio.ensure_future(_wakeups.wait(seen))
                done, _ = await asyncio.wait({wake, disconnect}, timeout=min(remaining, recheck),
                                             return_when=asyncio.FIRST_COMPLETED)
                wake.cancel()
                if disconnect in done:
                    return None
            seen = _wakeups.mark()
            *answer, _ = await _recheck(scope, body, seen)
            if _header(answer[1], PARK_HEADER) is None or loop.time() >= deadline:
                return answer
    finally:
        disconnect.cancel()


_rechecks: dict[tuple, tuple[int, asyncio.Future]] = {}  # the same request's view run in flight, by wake-up count


async def _recheck(scope: dict[str, Any], body: bytes, seen: int):
    """The view asked again for a parked request. Parked requests that are the same request (method, path, query,
    every header, body) share one asking if it began after their wake-up (`seen`): a deploy pipeline's N waits on one
    LB cost one view run, where they ran one after another on the re-check thread (3 waits answered 70, 200 and 230 ms
    after the node's record on a busy 2-core machine)."""
    # ASGI allows each header as a two-item list (unhashable); gunicorn's worker sends tuples.
    headers = tuple((bytes(name), bytes(value)) for name, value in scope["headers"])
    key = (scope["method"], scope["path"], scope.get("query_string", b""), headers, body)
    running = _rechecks.get(key)
    if running is not None and running[0] >= seen:
        return await asyncio.shield(running[1])
    future = asyncio.get_running_loop().run_in_executor(_recheck_pool, _run_wsgi, scope, body, "recheck")
    _rechecks[key] = (seen, future)
    try:
        return await asyncio.shield(future)  # a waiter that goes away leaves the run to the others
    finally:
        if _rechecks.get(key, (0, None))[1] is future:
            del _rechecks[key]


class _LocalLane:
    """This process's requests of one tenant waiting for its lane: one of them polls the server-wide lane at a time."""

    def __init__(self) -> None:
        self.lock = asyncio.Lock()  # first come, first served
        self.users = 0


_local_lanes: dict[str, _LocalLane] = {}


async def _in_lane(key: str, run: Callable[[], Awaitable[T]]) -> T:
    """`run()` (the request's turn for a thread), inside its tenant's lane while another tenant is about in any process
    of the server: one request of the tenant at a time in the whole server, not one per process (controlplane.crowd).
    The lane is waited for here, before a thread is asked for, so a request waiting for it holds none. Past
    LANE_WAIT_S (a holder stuck on a lock) the request runs without it: the lane orders a tenant's requests, it is not
    what keeps anything correct. A credential not proved yet (an address's key: behind a proxy, every user's first
    request) takes no lane and keeps one at a time per process."""
    if key.startswith(ADDRESS_PREFIX) or not _crowd.others_about(key, CROWD_S):
        return await run()
    local = _local_lanes.get(key)
    if local is None:
        local = _local_lanes[key] = _LocalLane()
    local.users += 1
    try:
        async with local.lock:
            fd, pause = _crowd.try_lane(key), 0.001
            deadline = asyncio.get_running_loop().time() + LANE_WAIT_S
            while fd is None and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(pause)
                pause = min(pause * 2, LANE_POLL_MAX_S)
                fd = _crowd.try_lane(key)
            if fd is None:
                log.warning("tenant %s: its lane was held longer than %.0f s; running this request beside it", key,
                            LANE_WAIT_S)
            try:
                return await run()
            finally:
                if fd is not None:
                    _crowd.leave(fd)
    finally:
        local.users -= 1
        if not local.users:
            del _local_lanes[key]


async def _disconnected(receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


def _release(key: str) -> None:
    from django.core.cache import cache

    with contextlib.suppress(ValueError):  # expired meanwhile
        cache.decr(key)


class _Wakeups:
    """One Redis subscription per process, counting "applied" messages: `wait(seen)` returns once the
    count passes `seen`, a count taken with `mark()` before the caller looked at the state. Waiting for
    "the next message" instead would miss one published between the look and the wait (measured: a
    change applied in that gap waited for the next unrelated change, 28 s in bench-scale)."""

    def __init__(self) -> None:
        self._count = 0
        self._event: asyncio.Event | None = None
        self._task: asyncio.Task | None = None

    def mark(self) -> int:
        if self._task is None or self._task.done():
            self._task = asyncio.ensure_future(self._listen() if settings.REDIS_URL else self._watch_file())
        return self._count

    async def wait(self, seen: int) -> None:
        self.mark()
        while self._count <= seen:
            if self._event is None:
                self._event = asyncio.Event()
            await self._event.wait()

    def _wake_all(self) -> None:
        self._count += 1
        event, self._event = self._event, None
        if event is not None:
            event.set()

    async def _listen(self) -> None:
        import redis.asyncio as aioredis

        from apps.core.wakeups import channel

        while True:
            try:
                client = aioredis.Redis.from_url(settings.REDIS_URL)
                async with client.pubsub() as pubsub:
                    await pubsub.subscribe(channel("applied"))
                    self._wake_all()  # a message may have been missed while we were not subscribed
                    async for message in pubsub.listen():
                        if message["type"] == "message":
                            self._wake_all()
            except asyncio.CancelledError:
                raise
            except Exception:  # parked requests still re-check periodically meanwhile
                log.warning("wake-up subscription lost; retrying", exc_info=True)
                await asyncio.sleep(1)


    async def _watch_file(self) -> None:
        """Without Redis: the wake file's modification time, looked at every WAKE_FILE_POLL_S (apps.core.wakeups)."""
        from apps.core.wakeups import WAKE_FILE_POLL_S, file_stamp

        last = file_stamp("applied")
        while True:
            await asyncio.sleep(WAKE_FILE_POLL_S)
            stamp = file_stamp("applied")
            if stamp != last:
                last = stamp
                self._wake_all()


_wakeups = _Wakeups()


def _header(headers: list[tuple[bytes, bytes]], name: str) -> str | None:
    for key, value in headers:
        if key == name.encode():
            return value.decode("latin1")
    return None


async def _send(send, status: int, headers: list[tuple[bytes, bytes]], content: bytes) -> None:
    headers = [(k, v) for k, v in headers if k not in (PARK_HEADER.encode(), RELEASE_HEADER.encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": content})


def _run_wsgi(scope: dict[str, Any], body: bytes,
              park: str) -> tuple[int, list[tuple[bytes, bytes]], bytes, str | None]:
    """Run the WSGI application for one request on this (pool) thread; buffer its answer. Also the tenant its
    credential proved, if any (TENANT_ENVIRON, set by authentication)."""
    environ = _environ(scope, body)
    environ["spillway.park"] = park
    started: dict[str, Any] = {}
    chunks: list[bytes] = []

    def start_response(status: str, headers: list[tuple[str, str]], exc_info=None):
        started["status"] = int(status.split(" ", 1)[0])
        started["headers"] = [(k.lower().encode("latin1"), v.encode("latin1")) for k, v in headers]
        return chunks.append

    result = wsgi_application(environ, start_response)
    try:
        chunks.extend(result)
    finally:
        close = getattr(result, "close", None)
        if close is not None:
            close()  # Django's request_finished: closes or recycles this thread's DB connection
    return started["status"], started["headers"], b"".join(chunks), environ.get(TENANT_ENVIRON)


def _environ(scope: dict[str, Any], body: bytes) -> dict[str, Any]:
    server = scope.get("server") or ("127.0.0.1", 80)
    client = scope.get("client") or ("", 0)
    environ: dict[str, Any] = {
        "REQUEST_METHOD": scope["method"],
        "SCRIPT_NAME": scope.get("root_path", "").encode().decode("latin1"),
        "PATH_INFO": scope["path"].encode().decode("latin1"),
        "QUERY_STRING": scope.get("query_string", b"").decode("latin1"),
        "SERVER_NAME": str(server[0]), "SERVER_PORT": str(server[1] or 80),
        "REMOTE_ADDR": str(client[0]), "REMOTE_PORT": str(client[1]),
        "SERVER_PROTOCOL": f"HTTP/{scope.get('http_version', '1.1')}",
        "CONTENT_LENGTH": str(len(body)),
        "wsgi.version": (1, 0), "wsgi.url_scheme": scope.get("scheme", "http"),
        "wsgi.input": io.BytesIO(body), "wsgi.errors": sys.stderr,
        "wsgi.multithread": True, "wsgi.multiprocess": True, "wsgi.run_once": False,
    }
    for raw_name, raw_value in scope["headers"]:
        name = raw_name.decode("latin1")
        if "_" in name:  # as gunicorn's WSGI workers: X_Forwarded_For must not pose as X-Forwarded-For
            continue
        key = name.upper().replace("-", "_")
        value = raw_value.decode("latin1")
        if key in ("CONTENT_LENGTH",):
            continue
        if key != "CONTENT_TYPE":
            key = "HTTP_" + key
        environ[key] = f"{environ[key]},{value}" if key in environ else value
    return environ
