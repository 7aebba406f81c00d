"""Which claims a route write reads: every claim that covers or overlaps one of its hosts, and no others
(route_rules.claims_related; before, every claim of every tenant was read for each write)."""

from __future__ import annotations

import random

import pytest

from apps.accounts.models import Organization
from apps.balancers import hostnames, route_rules
from apps.balancers.models import HostnameClaim

pytestmark = pytest.mark.django_db

LABELS = ["a", "b", "shop", "x"]


def _name(rng: random.Random) -> str:
    depth = rng.randint(1, 4)
    name = ".".join(rng.choice(LABELS) for _ in range(depth)) + ".test"
    return "*." + name if rng.random() < 0.4 else name


def test_the_claims_read_for_a_host_are_exactly_those_that_cover_or_overlap_it(acme) -> None:
    rng = random.Random(14)
    org = Organization.objects.get(pk=acme.pk)
    names = sorted({_name(rng) for _ in range(400)})
    HostnameClaim.objects.bulk_create([HostnameClaim(org=org, hostname=n, status="approved") for n in names])
    for _ in range(300):
        host = _name(rng)
        read = set(route_rules.claims_related([host]).values_list("hostname", flat=True))
        relevant = {n for n in names if hostnames.overlaps(n, host)}
        assert relevant <= read, (host, relevant - read)
        # Few rows beyond those: the names that would cover the host and, for a wildcard, the names under it.
        assert read <= relevant | {n for n in names if n in hostnames.related(host)[0]}, (host, read - relevant)


def test_route_writes_find_the_claim_that_decides_among_thousands(world, alice) -> None:
    """Alice's own wildcard claim lets her route a name under it; another tenant's claims refuse theirs."""
    other = Organization.objects.create(slug="other", name="Other", kind="customer")
    HostnameClaim.objects.bulk_create([HostnameClaim(org=other, hostname=f"h{i}.other.test", status="approved")
                                       for i in range(3000)])
    HostnameClaim.objects.create(org=other, hostname="*.taken.test", status="approved")
    HostnameClaim.objects.create(org=alice.org, hostname="*.mine.test", status="approved")

    def post(host: str, path: str):  # type: ignore[no-untyped-def]
        return alice.client.post("/api/v1/routes/", {
            "lb": world.acme_lb.pk, "path": path, "hosts": [host],
            "targets": [{"pool": world.acme_pool.pk, "weight": 100}]}, format="json")

    for i, host in enumerate(("api.mine.test", "*.deep.mine.test")):
        assert post(host, f"/ok{i}").status_code == 201, host
    for host in ("api.taken.test", "*.taken.test", "*.x.taken.test", "h2999.other.test", "mine.test"):
        answer = post(host, "/")
        assert answer.status_code == 400 and answer.json()["code"] == "hostname_not_claimed", (host, answer.content)
