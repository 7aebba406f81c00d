"""The dashboard's top routes: the most 5xx and the slowest p99 over the last 15 minutes, each tenant's own
routes only (on a shared LB too), in the order the figures say."""

from __future__ import annotations

import pytest
from django.test import Client

from apps.signals.selectors import top_routes
from tests.factories import LoadBalancerFactory, PoolFactory, RouteFactory
from tests.signals.signalkit import signal_bucket

pytestmark = pytest.mark.django_db


@pytest.fixture
def routes(ops, acme, globex):
    lb = LoadBalancerFactory(org=ops, shared=True, name="edge")
    made = {}
    for org, path, requests, s5xx, ms in ((acme, "/cart", 100, 10, 40), (acme, "/slow", 50, 0, 900),
                                          (globex, "/gx", 400, 200, 20)):
        route = RouteFactory(lb=lb, org=org, path=path, pool=PoolFactory(lb=lb, org=org))
        signal_bucket("route", route.pk, org=org, lb_id=lb.pk, requests=requests, s5xx=s5xx, upstream_ms=ms)
        made[path] = route
    return made


def test_each_tenant_sees_its_own_worst_routes_in_order(routes, alice, otto):
    mine = top_routes(alice.principal)
    assert [e["route"].path for e in mine["errors"]] == ["/cart"] and mine["errors"][0]["error_pct"] == 10.0
    assert [e["route"].path for e in mine["latency"]] == ["/slow", "/cart"]
    assert mine["latency"][0]["p99_ms"] >= 900 * 0.88
    everyone = top_routes(otto.principal)
    assert [e["route"].path for e in everyone["errors"]] == ["/gx", "/cart"]


def test_the_dashboard_panel_shows_them(routes, alice):
    client = Client()
    client.force_login(alice.user)
    html = client.get("/dashboard/routes/").content.decode()
    assert f'data-route="{routes["/cart"].pk}"' in html and "10.0%" in html
    assert "/gx" not in html and f'data-route="{routes["/gx"].pk}"' not in html
