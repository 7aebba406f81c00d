"""Sticky sessions in the rendered config (fleets.render.chain, "Sticky sessions"): what a sticky pool adds, that
HAProxy accepts it, that nothing changes for other pools, and the enforcer's room per region with hysteresis.
The behaviour on real nodes (sessions staying, drained members avoided): tests/traffic/test_live_sticky.py."""

from __future__ import annotations

import http.client
from dataclasses import replace

import pytest

from apps.fleets.config.check import validate_bundle
from apps.fleets.config.render import render
from apps.fleets.config.render.chain import ROOM_MAP, STICKY_DRAINED_MAP, STICKY_MEMBER_MAP
from apps.fleets.config.spec import MemberSpec, RegionStep
from apps.fleets.enforcement import NodeReading, _room
from apps.traffic.overflow import RegionCapacity, Steering
from tests.fleets.config.renderkit import NODE, listener, pool, serve, snapshot


def _sticky_snapshot(sticky: bool = True, drained: bool = False):
    members = {"eu": (MemberSpec("a1", "127.0.0.1", 8001, 100, "drain" if drained else "active", id=41),
                      MemberSpec("a2", "127.0.0.1", 8002, 100, id=42)),
               "us": (MemberSpec("b1", "127.0.0.1", 8003, 100, id=43),)}
    p = replace(pool(7, members, chain=(RegionStep("eu", 50), RegionStep("us", None))), sticky=sticky)
    return snapshot((listener(8080, default_pool_id=7),), (p,))


def test_a_sticky_pool_names_its_members_in_a_cookie_and_haproxy_accepts_it() -> None:
    bundle = render(_sticky_snapshot(drained=True), NODE)
    body = bundle.body
    assert "cookie spw7 insert indirect nocache httponly" in body
    assert "ignore-persist if { req.cook(spw7),map_str_int(maps/sticky.drained.map,0) -m int 1 }" in body
    assert "server a1 127.0.0.1:8001 weight 0 cookie m41" in body
    assert "server b1 127.0.0.1:8003 weight 100 cookie m43" in body
    assert ("http-request set-var(txn.sbe) req.cook(spw7),map(maps/sticky.member.map) "
            "if { var(txn.pool) -m int 7 }") in body
    assert {"m41 p7_eu", "m42 p7_eu", "m43 p7_us"} <= set(bundle.files[STICKY_MEMBER_MAP].decode().splitlines())
    assert {"m41 1", "m42 0", "m43 0"} <= set(bundle.files[STICKY_DRAINED_MAP].decode().splitlines())
    assert {"p7_eu 1", "p7_us 1"} <= set(bundle.files[ROOM_MAP].decode().splitlines())
    result = validate_bundle(bundle)
    assert result.ok, result.output


def test_a_pool_without_affinity_renders_no_cookie_no_rule_and_no_sticky_map() -> None:
    bundle = render(_sticky_snapshot(sticky=False), NODE)
    assert "cookie" not in bundle.body and "sticky" not in bundle.body
    assert not {ROOM_MAP, STICKY_MEMBER_MAP, STICKY_DRAINED_MAP} & set(bundle.files)


def _readings(rates: dict[str, float], live: str | None) -> dict[int, NodeReading]:
    return {1: NodeReading(1, "eu", True, rates={f"p7_{r}": v for r, v in rates.items()},
                           live_room={} if live is None else {"p7_eu": live, "p7_us": "1"})}


@pytest.mark.parametrize(("served", "live", "over_for", "want"), [
    (30.0, "1", None, 1),  # room
    (41.0, "1", None, 1),  # at capacity, within 5%: still room
    (43.0, "1", None, 1),  # over 5% just now: a moment's jitter moves no session
    (43.0, "1", 1.9, 1),  # ... nor one of almost ROOM_SUSTAIN_S
    (43.0, "1", 2.0, 0),  # over 5% for ROOM_SUSTAIN_S: full
    (39.0, "0", None, 0),  # was full, not yet under 95%
    (37.0, "0", None, 1),  # under 95%: room again
])
def test_room_follows_what_the_nodes_serve_with_hysteresis(served: float, live: str, over_for: float | None,
                                                          want: int) -> None:
    caps = [RegionCapacity("eu", 2, 20.0), RegionCapacity("us", 1, 80.0)]
    now = 1000.0
    over = {} if over_for is None else {"eu": now - over_for}
    room, changed, still_over = _room(7, caps, Steering(), _readings({"eu": served, "us": 10.0}, live), [1], over,
                                      now)
    assert room == {"p7_eu": want, "p7_us": 1}
    assert changed == ([] if str(want) == live else [("eu", want)])  # one event per change, none while it holds
    # the clock of an over-capacity region starts once and keeps running; it stops when the region is back
    assert still_over == ({"eu": over.get("eu", now)} if served > 42 else {})


def test_a_drained_failed_over_or_dialled_off_region_has_no_room_at_once() -> None:
    caps = [RegionCapacity("eu", 2, 20.0), RegionCapacity("us", 1, 80.0)]
    readings = _readings({"eu": 5.0, "us": 5.0}, "1")
    for steering in (Steering(drained=frozenset({"eu"})), Steering(failed_over=frozenset({"eu"})),
                     Steering(dials={"eu": 0.0})):
        assert _room(7, caps, steering, readings, [1], {}, 1000.0)[0]["p7_eu"] == 0


@pytest.mark.haproxy
def test_a_forged_cookie_naming_another_pools_member_never_leaves_the_pool(
        haproxy_node, tiny_backend, free_port) -> None:
    """Attacker: a client of pool 1 sends pool 1's sticky cookie with the id of a member of pool 2 (another
    tenant's, sticky too, on the same node). The member map knows that id, so without a check the request would go
    to pool 2's backend; it must be served by pool 1 and get pool 1's own cookie back."""
    mine, theirs = tiny_backend("mine"), tiny_backend("theirs")
    p1 = replace(pool(1, {"eu": (MemberSpec("mine", "127.0.0.1", mine.port, 100, id=11),)},
                      chain=(RegionStep("eu", None),)), sticky=True)
    p2 = replace(pool(2, {"eu": (MemberSpec("theirs", "127.0.0.1", theirs.port, 100, id=22),)},
                      chain=(RegionStep("eu", None),)), sticky=True)
    port, other = free_port(), free_port()
    serve(haproxy_node, snapshot((listener(port, default_pool_id=1),
                                  listener(other, default_pool_id=2, id=2, name="other")), (p1, p2)))
    for cookie in ("spw1=m22", "spw1=m11", "spw1=garbage", "spw2=m22"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/", headers={"Host": "example.com", "Cookie": cookie})
        answer = conn.getresponse()
        assert (answer.status, answer.read().decode()) == (200, "mine"), cookie
        assert (answer.getheader("Set-Cookie") or "spw1=m11").startswith("spw1=m11"), cookie
        conn.close()
