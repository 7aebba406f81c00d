"""Config-set digests (apps.fleets.config.digest): what drift detection and `already applied` compare."""

from __future__ import annotations

import os

from apps.fleets.config.digest import set_digest, set_digest_v1


def test_names_contents_and_their_boundaries_all_count() -> None:
    assert set_digest({"a": b"bc"}) != set_digest({"ab": b"c"})
    assert set_digest({"a": b"x", "b": b"y"}) != set_digest({"a": b"y", "b": b"x"})
    assert set_digest({"a": b""}) != set_digest({})
    assert set_digest({"b": b"2", "a": b"1"}) == set_digest({"a": b"1", "b": b"2"})


def test_a_large_file_remembered_by_identity_is_never_confused_with_another() -> None:
    """Large files' digests are remembered per content object (a 5 MB map shared by every node's bundle):
    an equal copy hashes the same, and a different content of the same size differs, however often asked."""
    big = os.urandom(200_000)
    other = bytearray(big)
    other[100_000] ^= 1
    first = set_digest({"maps/routes.map": big})
    for _ in range(3):
        assert set_digest({"maps/routes.map": big}) == first
        assert set_digest({"maps/routes.map": bytes(bytearray(big))}) == first
        assert set_digest({"maps/routes.map": bytes(other)}) != first
    assert set_digest_v1({"maps/routes.map": big}) != first  # the earlier definition: recognised, not equal

