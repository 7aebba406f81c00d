"""The collector's directory follows changes: a route added through the API is counted under itself within
CHANGE_CHECK_S, though its requests name nothing unknown (before, they went on resolving to the route that
matched before it until the collector restarted)."""

from __future__ import annotations

import pytest

from apps.signals import directory as directory_module
from apps.signals.directory import DatabaseDirectory
from apps.signals.logline import parse
from tests.factories import LoadBalancerFactory, PoolFactory, RouteFactory

pytestmark = pytest.mark.django_db


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _line(lb_name: str, path: str) -> bytes:
    return (f"spw1 f/n1 fe_{lb_name}.http - - 200 0 1 5 6 0 ---- 120 {path} shop.example").encode()


def test_a_route_added_through_the_api_is_counted_under_itself_within_seconds(otto, ops):
    lb = LoadBalancerFactory(org=ops, name="dir")
    from apps.balancers.models import Listener

    pool = PoolFactory(lb=lb, org=ops)
    Listener.objects.create(lb=lb, name="http", port=8080, default_pool=pool)
    catch_all = RouteFactory(lb=lb, org=ops, path="/", priority=10)
    from apps.balancers.models import Region
    from apps.fleets.models import Fleet, Node

    fleet = Fleet.objects.create(name="f", region=Region.objects.get_or_create(slug="us-east")[0])
    Node.objects.create(fleet=fleet, name="n1", address="10.0.0.1", runtime_dir="/r", config_dir="/c")
    clock = Clock()
    directory = DatabaseDirectory(clock=clock)
    directory.load()
    request = parse(_line("dir", "/new/x"))
    assert request is not None
    assert directory.resolve(request).route[0] == catch_all.pk

    made = otto.client.post("/api/v1/routes/", {"lb": lb.pk, "path": "/new", "priority": 1,
                                                "targets": [{"pool": pool.pk}]}, format="json")
    assert made.status_code == 201, made.content
    directory.maybe_reload()
    assert directory.resolve(request).route[0] == catch_all.pk  # checked at most every CHANGE_CHECK_S
    clock.now += directory_module.CHANGE_CHECK_S
    directory.maybe_reload()
    assert directory.resolve(request).route[0] == made.json()["id"]


def test_a_line_naming_no_node_of_ours_counts_nowhere(otto, ops):
    """Anyone who reaches the collector's port can send a line: one naming no node Spillway runs could fake a
    node's figures (and trip or hide a canary)."""
    lb = LoadBalancerFactory(org=ops, name="dir")
    from apps.balancers.models import Listener

    Listener.objects.create(lb=lb, name="http", port=8080, default_pool=PoolFactory(lb=lb, org=ops))
    directory = DatabaseDirectory(clock=Clock())
    directory.load()
    assert directory.resolve(parse(_line("dir", "/x"))).listener is None  # f/n1 is not a node here
    huge = parse(b"spw1 f/n1 fe_dir.http - - 200 0 1 5 6 0 ---- 99999999999999999999999 /x h")
    assert huge is not None and huge.bytes == 0  # not a size a request has: never a column overflow
    assert parse(b"spw1 " + b"n" * 300 + b" fe_dir.http - - 200 0 1 5 6 0 ---- 1 /x h") is None
