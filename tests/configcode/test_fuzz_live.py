"""Config documents fuzzed against the live server (tests/configfuzz.py): no 5xx, every error in the documented
shape. 300 cases here; `make bench-fuzz` runs more."""

from __future__ import annotations

import pytest

from apps.balancers.models import Listener
from apps.fleets.models import Certificate
from tests import configfuzz
from tests.factories import (
    LoadBalancerFactory,
    MemberFactory,
    PoolFactory,
    PoolRegionFactory,
    RegionFactory,
    RouteFactory,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.timeout(300)]


def test_no_config_document_makes_the_server_fail(live_server, acme, globex, otto, alice):
    region = RegionFactory(slug="eu-west")
    lb = LoadBalancerFactory(org=acme, name="web")
    pool = PoolFactory(lb=lb, org=acme, name="api")
    PoolRegionFactory(pool=pool, region=region, max_rate_per_member=100)
    MemberFactory(pool=pool, region=region, name="m1", address="127.0.0.11", port=8080)
    RouteFactory(lb=lb, priority=10, path="/api", pool=pool)
    Listener.objects.create(lb=lb, name="http", port=18080, default_pool=pool)
    other = LoadBalancerFactory(org=globex, name="globex-lb")
    PoolFactory(lb=other, org=globex, name="web")
    Certificate.objects.create(org=globex, name="globex-cert", cert_pem="x", key_encrypted="x")

    for persona, seed in ((alice, 1), (otto, 2)):  # the tenant, and the operator applying for it
        tally = configfuzz.run(live_server.url, persona.token, "acme", examples=150, seed=seed)
        print(tally.line(), tally.by_status)
        assert tally.cases >= 140
        assert not tally.server_errors, "\n".join(tally.server_errors[:10])
        assert not tally.shape_errors, "\n".join(tally.shape_errors[:10])
