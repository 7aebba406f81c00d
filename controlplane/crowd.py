"""What the web server's processes know together: which tenants were about lately, and one lane per tenant.

Fair turns (controlplane.fairturns) keep a tenant to one request at a time per process while another tenant is
about. Each process knew only its own requests, though: a quiet tenant's requests landed in one process, and the
other, seeing the busy tenant alone, ran three of its requests at once on a 2-core machine (bench-tenants --sizes
small, a server-side log of each request: the quiet tenant's create used the same CPU beside the busy tenant as
alone, 33-34 ms, and took 50-97 ms instead of 44-55, each time with three of the busy tenant's requests running in
the other process). Here
- `Crowd`: a table every process of the server maps (a file under the install's VAR_DIR), one slot per tenant hash,
  holding when each was last seen; a process asks whether another tenant was seen within CROWD_S by
  any process;
- lanes: while crowded, a tenant's request runs holding its tenant's lane (an exclusive flock on a file of its own),
  so it runs one request at a time in the whole server, not one per process. The web server waits for a lane on
  its event loop before it asks for a thread (controlplane.asgi._in_lane), so a request waiting for its lane holds
  no thread.
A tenant alone keeps the whole server (all threads but one of each process), as before. Only tenants a credential
proved are published here: a request not yet known (an address's key: a probe, a scrape, anyone's first request)
never crowds the server's tenants.
"""

from __future__ import annotations

import fcntl
import hashlib
import mmap
import os
import struct
import time
from collections.abc import Callable

SLOTS = 1024
# The table is read at most this often per process (a read of every slot costs ~0.15 ms; a request asks several
# times): a tenant seen elsewhere crowds this process this much later at most.
REREAD_S = 0.01
_SLOT = struct.Struct("<Qd")  # the tenant key's hash (0: empty), when last seen (CLOCK_MONOTONIC: one clock per host)


def key_hash(key: str) -> int:
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little") or 1


def server_dir(var_dir: str, identity: str) -> str:
    """A directory the web processes serving one database share, under the install's own `var_dir` (a directory in
    /dev/shm, which anyone may create first, could be another user's: lanes they held would stall a tenant).
    `identity` names the database: two servers of one install share its cores and are one server here; the test
    databases stay apart."""
    digest = hashlib.blake2b(identity.encode(), digest_size=6).hexdigest()
    path = os.path.join(var_dir, "run", f"crowd-{digest}")
    os.makedirs(path, mode=0o700, exist_ok=True)
    return path


class Crowd:
    def __init__(self, directory: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.directory = directory
        self._clock = clock
        path = os.path.join(directory, "seen")
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            size = SLOTS * _SLOT.size
            if os.fstat(fd).st_size < size:
                os.ftruncate(fd, size)
            self._map = mmap.mmap(fd, size)
        finally:
            os.close(fd)
        self._read: tuple[float, float, frozenset[int]] | None = None  # (when, within_s, hashes seen within_s)

    def seen(self, key: str) -> None:
        """`key` started or ended a request now. A slot shared by two tenants' hashes holds the latest one: the
        other is then missed until it is seen again (a process's own requests are known to it anyway)."""
        h = key_hash(key)
        _SLOT.pack_into(self._map, (h % SLOTS) * _SLOT.size, h, self._clock())

    def others_about(self, key: str, within_s: float) -> bool:
        """Another tenant was seen by any process of the server within `within_s` (as of REREAD_S ago at most)."""
        now = self._clock()
        if self._read is None or self._read[1] != within_s or not 0 <= now - self._read[0] < REREAD_S:
            horizon = now - within_s
            self._read = (now, within_s, frozenset(h for h, at in _SLOT.iter_unpack(self._map) if h and at > horizon))
        recent = self._read[2]
        return len(recent) > (key_hash(key) in recent)

    def try_lane(self, key: str) -> int | None:
        """`key`'s lane if no one in the server holds it: a file descriptor to give back with `leave`, else None.
        One holder in the whole server at a time (an flock, let go with the file, also when a process dies)."""
        fd = os.open(os.path.join(self.directory, f"lane-{key_hash(key):016x}"),
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        return fd

    @staticmethod
    def leave(fd: int) -> None:
        os.close(fd)
