"""Hostname claim rules, pure: who may route which host, and which claims overlap."""

from __future__ import annotations

import functools

from publicsuffixlist import PublicSuffixList


def normalize(hostname: str) -> str:
    return hostname.strip().lower().rstrip(".")


def covers(claim: str, host: str) -> bool:
    """Does `claim` (exact or `*.suffix`) cover `host` (exact or wildcard)?

    `*.example.com` covers `a.example.com`, `a.b.example.com` and `*.a.example.com`,
    but not `example.com` itself: the same rule the renderer applies with a
    suffix match on `.example.com`.
    """
    claim, host = normalize(claim), normalize(host)
    if claim == host:
        return True
    if claim.startswith("*."):
        suffix = claim[1:]  # ".example.com"
        bare = host[2:] if host.startswith("*.") else host
        return bare.endswith(suffix) and len(bare) > len(suffix)
    return False


def overlaps(a: str, b: str) -> bool:
    """Two claims overlap when some hostname would be covered by both."""
    return covers(a, b) or covers(b, a)


def related(host: str) -> tuple[set[str], str | None]:
    """Which claims can cover or overlap `host`, so a check reads those rows instead of every claim: the
    names that would cover it (itself and `*.` + each shorter suffix), and for a wildcard the suffix every
    name it covers ends with (`*.shop.test` -> ".shop.test"). overlaps(claim, host) implies that the claim
    is one of those names or ends with that suffix (tests/balancers/test_hostnames.py holds it to that)."""
    host = normalize(host)
    bare = host[2:] if host.startswith("*.") else host
    labels = bare.split(".")
    names = {host, *("*." + ".".join(labels[i:]) for i in range(1, len(labels)))}
    return names, (host[1:] if host.startswith("*.") else None)


@functools.cache
def _suffixes() -> PublicSuffixList:
    # The Public Suffix List bundled with the pinned release (private domains such as github.io included).
    return PublicSuffixList()


def is_public_suffix(hostname: str) -> bool:
    """`co.uk`, `github.io`, `*.github.io`: names under which many unrelated owners register their own."""
    host = normalize(hostname)
    bare = host[2:] if host.startswith("*.") else host
    return bool(bare) and _suffixes().is_public(bare)


def inside(host: str, claim: str) -> bool:
    """Is `host` at or under the name `claim` holds (`x.globex.example.com` inside `globex.example.com` and
    inside `*.globex.example.com`)?"""
    host, claim = normalize(host), normalize(claim)
    base = claim[2:] if claim.startswith("*.") else claim
    bare = host[2:] if host.startswith("*.") else host
    return bare == base or bare.endswith("." + base)
