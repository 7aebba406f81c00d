"""The digests of config sets on nodes, remembered by a key naming the set (no Django).

A transport answers "which set does the node serve" (config_sha256) from here while the set's signature holds, and
links the files a push keeps from the set's files as pushed or read (local.py, ssh.py say what their signature
covers).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping

from apps.fleets import caches

# A config set's digest (and, for a set this process pushed, its files as pushed) by a key naming the set on its node,
# valid while the set's signature holds: what its transport reads of the files' metadata cheaply (local.py, ssh.py
# say what theirs covers). Sets are never changed in place (a push writes a new one), so only an edit on the node
# changes a signature; then the set is read and hashed again. Drift checks (`config_sha256(fresh=True)`) always read.
_SET_DIGESTS: OrderedDict[Hashable, tuple[tuple, str, Mapping[str, bytes] | None]] = caches.register(
    "set_digests", OrderedDict())
# Three sets a node at most (current, previous, a push in flight) for every node a process rolls out: 256 made a
# 100-node fleet's rollouts miss, and each miss read and hashed the node's whole set again.
_SET_DIGESTS_SIZE = 8192
_SET_DIGESTS_LOCK = threading.Lock()


def remember_digest(key: Hashable, signature: tuple, digest: str, files: Mapping[str, bytes] | None = None) -> None:
    with _SET_DIGESTS_LOCK:
        _SET_DIGESTS[key] = (signature, digest, files)
        _SET_DIGESTS.move_to_end(key)
        while len(_SET_DIGESTS) > _SET_DIGESTS_SIZE:
            _SET_DIGESTS.popitem(last=False)


def recorded_digest(key: Hashable) -> tuple[tuple, str, Mapping[str, bytes] | None] | None:
    """(signature, digest, files or None) as remembered for the set, whatever it holds now."""
    with _SET_DIGESTS_LOCK:
        return _SET_DIGESTS.get(key)


def forget_digests(gone: Callable[[Hashable], bool]) -> None:
    with _SET_DIGESTS_LOCK:
        for key in [k for k in _SET_DIGESTS if gone(k)]:
            _SET_DIGESTS.pop(key, None)
