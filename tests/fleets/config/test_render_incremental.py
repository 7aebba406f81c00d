"""Route-only changes applied to a listener's kept maps == a full render of the changed snapshot, byte for byte.

GIVEN a listener's routes laid out once (ListenerRoutes) and its rendered bundle,
WHEN random route creations, updates and deletions (exact hosts, wildcards, any-host, redirects,
prefix/exact, priorities) are applied change by change and the bundle is patched with the maps they move,
THEN every file, the manifest's map entries and owners, and the bundle's sha256 equal a full render of the
snapshot holding the same routes; and a change of the listener's pool/split actions is refused (None),
since it changes haproxy.cfg, which only a full render may write.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from apps.fleets.config.render import incremental, patch_maps, render
from apps.fleets.config.render.frontends import map_bucket, redirects_map_name, routes_map_name
from apps.fleets.config.render.guard import check_snapshot
from apps.fleets.config.render.incremental import ListenerRoutes
from apps.fleets.config.spec import NodeSpec, RouteSpec, RouteTargetSpec
from apps.fleets.node.mapdelta import map_delta
from tests.fleets.config.renderkit import listener, member, pool, snapshot

NODE = NodeSpec(name="n1", runtime_dir="/run/spillway/t", bind_address="127.0.0.1")
HOSTS = ["a.test", "b.test", "x.a.test", "y.x.a.test", "*.a.test", "*.x.a.test", "*.b.test", "c.test", "d.test"]
PATHS = ["/", "/api", "/api/v1", "/apix", "/s", "/s/t", "/a/b/c", "/x"]


def _random_route(rng: random.Random, route_id: int, pools: list[int], rare: float = 0.03) -> RouteSpec:
    hosts = tuple(sorted(set(rng.sample(HOSTS, rng.choice([0, 1, 1, 1, 2])))))
    redirect = f"https://r.test/{route_id}" if rng.random() < 0.25 else None
    # Pool 3 is rare: a route to it, or the last one leaving it, changes haproxy.cfg (a refused change).
    pool_id = 3 if rng.random() < rare else rng.choice(pools)
    targets = () if redirect else (RouteTargetSpec(pool_id=pool_id, weight=1),)
    return RouteSpec(id=route_id, priority=rng.randint(1, 40), hosts=hosts,
                     path_match=rng.choice(["prefix", "prefix", "exact"]), path=rng.choice(PATHS),
                     targets=targets, redirect_url=redirect)


def _snap(routes: dict[int, RouteSpec], revision: int):  # type: ignore[no-untyped-def]
    pools = tuple(pool(i, {"eu": (member(f"m{i}", 9000 + i),)}) for i in (1, 2, 3))
    ordered = tuple(sorted(routes.values(), key=lambda r: (r.priority, r.id)))
    return snapshot((listener(8080, ordered, default_pool_id=1),), pools, revision=revision)


def _assert_same(patched, full) -> None:  # type: ignore[no-untyped-def]
    assert patched.files.keys() == full.files.keys()
    for name in full.files:
        assert patched.files[name] == full.files[name], name
    assert patched.rendered_manifest.maps == full.rendered_manifest.maps
    for name, owners in full.rendered_manifest.map_owners.items():
        assert list(patched.rendered_manifest.map_owners[name]) == list(owners), name
    assert patched.rendered_manifest.header_len == full.rendered_manifest.header_len
    assert patched.sha256 == full.sha256


@pytest.mark.parametrize("large_class", [incremental.LARGE_CLASS, 1], ids=["as-shipped", "every-class-kept"])
def test_random_route_changes_patch_the_bundle_exactly_as_a_full_render(large_class: int, monkeypatch) -> None:
    """Also with every class kept key by key (render/kept_class.py), which the shipped threshold keeps for classes
    larger than this corpus's."""
    monkeypatch.setattr(incremental, "LARGE_CLASS", large_class)
    rng = random.Random(20261123)
    routes = {i: _random_route(rng, i, [1, 2], rare=0.0) for i in range(1, 120)}
    bundle = render(_snap(routes, 1), NODE)
    state = ListenerRoutes(check_snapshot(_snap(routes, 1)).listeners[0])
    applied = refused = 0
    next_id = 1000
    kept: list[tuple] = []  # (patched, full) of every applied change: later changes must not move them
    for revision in range(2, 160):
        upserts, deletes = [], []
        for _ in range(rng.choice([1, 1, 2, 4])):
            kind = rng.random()
            if kind < 0.4 or not routes:
                upserts.append(_random_route(rng, next_id, [1, 2]))
                next_id += 1
            elif kind < 0.7:
                upserts.append(_random_route(rng, rng.choice(list(routes)), [1, 2]))
            else:
                deletes.append(rng.choice(list(routes)))
        upserts = list({r.id: r for r in upserts if r.id not in deletes}.values())
        for r in upserts:
            routes[r.id] = r
        for i in deletes:
            routes.pop(i, None)
        full = render(_snap(routes, revision), NODE)
        updates = state.apply(upserts, deletes)
        if updates is None:  # the pool set moved: a full render, and the state is rebuilt from it
            refused += 1
            assert full.body != bundle.body
            state = ListenerRoutes(check_snapshot(_snap(routes, revision)).listeners[0])
            bundle = full
            continue
        patched = patch_maps(bundle, updates)
        _assert_same(patched, full)
        for update in updates:  # the key-level change is the one hotmaps computes from whole maps
            if update.delta is not None:
                whole = map_delta(update.name, bundle.rendered_manifest.maps[update.name], update.entries)
                assert whole is not None
                for part in ("added", "changed", "removed"):
                    assert sorted(getattr(update.delta, part)) == sorted(getattr(whole, part)), part
        bundle = patched
        applied += 1
        kept.append((patched, full))
    assert applied > 100 and refused > 0
    for patched, full in kept:  # a revision's entries and owners stay its own (nodes roll out from them later)
        _assert_same(patched, full)


def test_a_change_of_the_listeners_actions_is_refused() -> None:
    """A route to a pool no route used before adds per-pool rules to haproxy.cfg: not a maps-only change."""
    routes = {1: RouteSpec(id=1, priority=1, hosts=("a.test",), path_match="prefix", path="/", targets=(
        RouteTargetSpec(pool_id=1, weight=1),))}
    state = ListenerRoutes(check_snapshot(_snap(routes, 1)).listeners[0])
    to_two = replace(routes[1], id=2, path="/two", targets=(RouteTargetSpec(pool_id=2, weight=1),))
    assert state.apply([to_two], []) is None
    redirect = replace(routes[1], id=3, hosts=("b.test",), path="/r", targets=(), redirect_url="https://r.test/")
    state = ListenerRoutes(check_snapshot(_snap(routes, 1)).listeners[0])
    updates = state.apply([redirect], [])
    assert updates is not None  # a redirect on a new host moves three maps, and nothing else
    moved = {u.name for u in updates}
    assert moved == {routes_map_name("maps/web.http", map_bucket("b.test")), "maps/web.http.hosts.map",
                     redirects_map_name("maps/web.http", map_bucket("u3"))}


def test_a_first_route_to_the_default_pool_is_owned_like_any_other() -> None:
    """The default pool is one of the listener's keys before any route uses it: a route to it later is a lane
    change, and its map entries have owners (the revision's problems and diff name them)."""
    routes = {1: RouteSpec(id=1, priority=1, hosts=("a.test",), path_match="prefix", path="/x", targets=(
        RouteTargetSpec(pool_id=2, weight=1),))}
    state = ListenerRoutes(check_snapshot(_snap(routes, 1)).listeners[0])
    redirect = replace(routes[1], id=2, path="/r", targets=(), redirect_url="https://r.test/")
    assert state.apply([redirect], []) is not None  # the owners are made here, before pool 1 has a route
    to_default = replace(routes[1], id=3, path="/d", targets=(RouteTargetSpec(pool_id=1, weight=1),))
    updates = state.apply([to_default], [])
    assert updates is not None
    routes_map = next(u for u in updates if u.name == routes_map_name("maps/web.http", map_bucket("a.test")))
    owners = {key: owner for (key, _), owner in zip(routes_map.entries, routes_map.owners, strict=True)}
    assert owners["a.test/d/"].pools == (1,) and owners["a.test/r/"].route == 2
