"""Route-only changes applied key by key (apps.fleets.node.mapdelta) end exactly where a full render would.

Real HAProxy nodes: after each route create / update / delete, every node's live maps (`show map`) equal
the entries of the full render of the revision it recorded, its worker is the same (no reload), and
requests are served by the changed routes. A change that is not map-only still reloads.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from apps.balancers.models import Route, RouteTarget
from apps.fleets.config.render.frontends import map_bucket, routes_map_name
from apps.fleets.node import apply as delivery
from tests.fleets.fleetkit import (
    LocalFleet,
    add_pool,
    add_route,
    live_maps_equal_a_full_render,
    reconcile,
    rolled_out,
    serving_local_fleet,
    workers,
)

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]

# The bucket of the test routes' host class (frontends.MAP_BUCKETS).
ROUTES_MAP = routes_map_name("maps/web.http", map_bucket("a.example.com"))


@pytest.fixture
def fleet3(haproxy_bin, tiny_backend) -> Iterator[LocalFleet]:
    with serving_local_fleet(tiny_backend("old"), name="web", subnet=72, node_count=3) as local:
        yield local


def test_route_create_update_delete_move_only_their_keys_and_end_as_a_full_render(
    fleet3: LocalFleet, tiny_backend, monkeypatch
) -> None:
    # The moved keys' read-back is the proof of a route-only change: no listener probes or `show stat`
    # (verify), which lists every backend and server of the node; a reload is still verified.
    verified: list[str] = []
    real_verify = delivery.verify
    monkeypatch.setattr(delivery, "verify", lambda *args: verified.append(args[2]) or real_verify(*args))
    new, other = tiny_backend("new"), tiny_backend("other")
    pool_new = add_pool(fleet3.lb, "new", (new.address, new.port))
    pool_other = add_pool(fleet3.lb, "other", (other.address, other.port))
    add_route(fleet3.lb, pool_new, "/new", 10, hosts=["a.example.com"])
    kept = add_route(fleet3.lb, pool_other, "/kept", 20, hosts=["a.example.com"])
    reconcile(fleet3.fleet)
    before = workers(fleet3)
    live_maps_equal_a_full_render(fleet3)
    assert sorted(verified) == sorted(n.address for n in fleet3.nodes)  # the pools' reload: verified
    verified.clear()

    # Create: the new keys are added to the live map (appended: HAProxy lists them last), not swapped in.
    created = add_route(fleet3.lb, pool_new, "/hot", 11, hosts=["a.example.com"])
    revision = rolled_out(fleet3).revision
    # Same haproxy.cfg as a revision that passed `haproxy -c`: only the maps moved, so no second check.
    assert revision.validation_ok and revision.validation_output.startswith("Only map contents changed")
    live = live_maps_equal_a_full_render(fleet3)
    assert {k for k, _ in live[ROUTES_MAP][-2:]} == {"a.example.com/hot/", "a.example.com/hot?"}
    assert {fleet3.get(n, "/hot/x", host="a.example.com")[1] for n in fleet3.nodes} == {"new"}

    # Update: the same keys now point at the other pool (`set map`).
    RouteTarget.objects.filter(route=created).update(pool=pool_other)
    rolled_out(fleet3)
    live_maps_equal_a_full_render(fleet3)
    assert {fleet3.get(n, "/hot/x", host="a.example.com")[1] for n in fleet3.nodes} == {"other"}

    # Delete: its keys leave; /kept still served, /hot falls back to the listener's default pool.
    Route.objects.filter(pk=created.pk).delete()
    rolled_out(fleet3)
    live = live_maps_equal_a_full_render(fleet3)
    assert not any(k.startswith("a.example.com/hot") for k, _ in live[ROUTES_MAP])
    assert {fleet3.get(n, "/hot/x", host="a.example.com")[1] for n in fleet3.nodes} == {"old"}
    assert {fleet3.get(n, "/kept", host="a.example.com")[1] for n in fleet3.nodes} == {"other"}

    # A wildcard host moves the order-dependent wildcards map: replaced whole, still exact.
    add_route(fleet3.lb, pool_new, "/w", 12, hosts=["*.b.example.com"])
    rolled_out(fleet3)
    live_maps_equal_a_full_render(fleet3)
    assert {fleet3.get(n, "/w/1", host="x.b.example.com")[1] for n in fleet3.nodes} == {"new"}
    assert workers(fleet3) == before, "route-only changes must not reload"
    assert verified == []

    # Not map-only: a pool's first route adds its backend to haproxy.cfg, so every node reloads.
    third = tiny_backend("third")
    add_route(fleet3.lb, add_pool(fleet3.lb, "third", (third.address, third.port)), "/t", 13,
              hosts=["a.example.com"])
    rollout = rolled_out(fleet3)
    assert all(r.reload_ms is not None for r in rollout.results.all())
    assert sorted(verified) == sorted(n.address for n in fleet3.nodes)
    assert "Configuration file is valid" in rollout.revision.validation_output, "a new haproxy.cfg is checked"
    after = workers(fleet3)
    assert all(after[name] != pid for name, pid in before.items())
    live_maps_equal_a_full_render(fleet3)
    assert {fleet3.get(n, "/t", host="a.example.com")[1] for n in fleet3.nodes} == {"third"}
    assert kept.pk  # untouched throughout
