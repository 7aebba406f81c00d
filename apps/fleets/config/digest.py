"""The digest of a config set (a bundle before its push, a node's files on disk): one definition, no Django.

A set's digest is sha256 over its files in name order, each framed as name NUL length NUL sha256(content),
so the digest of a large file is computed once and shared: at 100k routes every node's bundle and the
revision's reference bundle hold the same 5 MB routes map (the same bytes object, render.patch_maps), and
hashing it whole into each of them cost ~4 x 3.2 ms per node and route change, on the reconcile's path.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from apps.core.memo import IdentityMemo

# The ACME HTTP-01 answers' map (render/frontends.py): rendered empty, and on a node written with the answers its
# worker serves (node/apply.py persist_answers), so that a node restarted from its own files still answers an open
# order. Its content follows the node's runtime state, not the revision: a set's digest counts it as rendered
# (empty), so answers never make a node look drifted and every digest recorded before stays valid.
ACME_ANSWERS_FILE = "maps/acme-challenges.map"

# Files at least this large have their digest remembered by the identity of their content.
_REMEMBER_FROM = 64 * 1024
_large_digest = IdentityMemo(lambda content: hashlib.sha256(content).digest(), size=256)


def file_digest(content: bytes) -> bytes:
    """sha256 of one file's content (remembered for large ones, by the identity of the content)."""
    if len(content) < _REMEMBER_FROM:
        return hashlib.sha256(content).digest()
    return _large_digest(content)


def set_digest(files: Mapping[str, bytes]) -> str:
    """Canonical hash of a config set: sorted names, each as name NUL length NUL sha256(bytes); no two sets
    with different names or contents collide (the framing fixes where each name and digest ends)."""
    digest = hashlib.sha256()
    for name in sorted(files):
        content = b"" if name == ACME_ANSWERS_FILE else files[name]
        digest.update(name.encode() + b"\0" + str(len(content)).encode() + b"\0" + file_digest(content))
    return digest.hexdigest()


def set_digest_v1(files: Mapping[str, bytes]) -> str:
    """The set digest as recorded before file digests (every byte hashed into the set's one sha256): nodes
    verified by an earlier version carry it in Node.applied_sha256 until their next rollout, and a drift check
    recognises their unchanged files by it (drift.fleet_drift_report) instead of calling them drifted."""
    digest = hashlib.sha256()
    for name in sorted(files):
        content = files[name]
        digest.update(name.encode() + b"\0" + str(len(content)).encode() + b"\0")
        digest.update(content)
    return digest.hexdigest()
