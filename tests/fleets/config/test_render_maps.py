"""Map form == rule form: the map layout for large listeners routes exactly like priority-ordered rules.

The layout rests on HAProxy 2.6's map semantics (map_beg = longest prefix, map_end = first in file);
the first test pins that measurement so a version that changes it fails here, not in production.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from apps.fleets.config.render import resolve_route
from apps.fleets.config.render.frontends import ACME_CHALLENGE_MAP, map_bucket, routes_map_files, routes_map_name
from apps.fleets.config.render.routing import RouteMaps, build_route_maps
from apps.fleets.config.spec import FleetSnapshot
from tests.fleets.config.renderkit import Client, backend_pool, listener, route, serve, snapshot
from tests.haproxykit import TinyBackend

# --- map form == rule form ------------------------------------------------------------------------


@pytest.mark.haproxy
def test_map_beg_in_haproxy_is_longest_prefix_not_file_order(haproxy_node, free_port) -> None:
    """The measurement the map layout rests on (see routing.py); fails loudly if a version changes it."""
    port = free_port()
    maps = {"maps/beg.map": b"/a first\n/a/b/c second\n/a/b third\n"}
    haproxy_node(
        f"""
frontend fe
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain lf-string "%[path,map_beg(maps/beg.map)]"
""",
        files=maps,
    )
    client = Client(port)
    assert client.get("/a/b/c/d") == "second"
    assert client.get("/a/b/x") == "third"
    assert client.get("/a/x") == "first"
    client.close()


def _corpus_snapshot(port: int, backends: list[TinyBackend]) -> FleetSnapshot:
    rng = random.Random(20261121)
    host_patterns = ["a.test", "b.test", "x.a.test", "*.a.test", "*.x.a.test", "*.b.test", "c.test"]
    paths = [
        "/api",
        "/api/v1",
        "/api/v1/users",
        "/apix",
        "/static",
        "/static/img",
        "/s",
        "/a",
        "/a/b",
        "/a/b/c",
        "/v2",
        "/v2/x",
    ]
    priorities = rng.sample(range(1, 10_000), 150)
    routes = []
    for i, priority in enumerate(priorities):
        # Mostly one or two host patterns: a high-priority any-host prefix would shadow too much.
        hosts = tuple(rng.sample(host_patterns, rng.choice([0, 1, 1, 1, 1, 2, 2, 2, 2, 2])))
        path = "/" if rng.random() < 0.03 else rng.choice(paths)
        target = rng.randrange(len(backends))
        redirect = f"https://r{i}.test/to%20{i}" if rng.random() < 0.1 else None
        routes.append(
            route(
                100 + i,
                priority,
                path,
                None if redirect else target + 1,
                hosts=hosts,
                match=rng.choice(["prefix", "prefix", "exact"]),
                redirect=redirect,
            )
        )
    pools = tuple(backend_pool(i + 1, b) for i, b in enumerate(backends))
    return snapshot((listener(port, tuple(routes), default_pool_id=1),), pools)


@pytest.mark.haproxy
def test_map_form_routes_a_corpus_exactly_like_the_rule_form(haproxy_node, tiny_backend, free_port) -> None:
    backends = [tiny_backend(f"b{i}") for i in range(1, 7)]
    rule_port, map_port = free_port(), free_port()
    rule_snap = _corpus_snapshot(rule_port, backends)
    map_snap = replace(rule_snap, listeners=(replace(rule_snap.listeners[0], port=map_port),))
    rule_bundle = serve(haproxy_node, rule_snap, name="rules", threshold=10_000)
    map_bundle = serve(haproxy_node, map_snap, name="maps", threshold=0)
    # The rule form uses no route maps (chain maps and the always-present, empty ACME challenge map are not).
    assert not any(k.startswith("maps/") and not k.startswith("maps/chain.") and k != ACME_CHALLENGE_MAP
                   for k in rule_bundle.files)
    assert set(routes_map_files("maps/web.http")) <= set(map_bundle.files)

    hosts = [
        "a.test",
        "A.Test:81",
        "b.test",
        "x.a.test",
        "y.x.a.test",
        "q.y.x.a.test",
        "z.b.test",
        "c.test",
        "d.test",
        "test",
        "a.test.evil",
        "xa.test",
    ]
    paths = [
        "/",
        "/api",
        "/api/",
        "/api/v1",
        "/api/v1/users",
        "/api/v1/users/7",
        "/apix",
        "/apixy",
        "/apiv1",
        "/static",
        "/static/img/x.png",
        "/s",
        "/sx",
        "/a",
        "/a/b",
        "/a/b/c",
        "/a/b/cd",
        "/ab",
        "/v2",
        "/v2/x",
        "/v2/xy",
        "/nothing",
        "/api?x=1",
        "/a/b?c",
    ]
    rules, maps = Client(rule_port), Client(map_port)
    by_pool = {f"p{i + 1}": b.name for i, b in enumerate(backends)}
    mismatches = []
    outcomes: set[int | None] = set()
    for host in hosts:
        for path in paths:
            expected_route = resolve_route(rule_snap.listeners[0].routes, host, path.split("?")[0])
            if expected_route is None:
                expected = by_pool["p1"]
            elif expected_route.redirect_url:
                expected = "redirect " + expected_route.redirect_url
            else:
                expected = by_pool[f"p{expected_route.targets[0].pool_id}"]
            outcomes.add(expected_route.id if expected_route else None)
            got_rules, got_maps = rules.get(path, host), maps.get(path, host)
            if not got_rules == got_maps == expected:
                mismatches.append((host, path, expected, got_rules, got_maps))
    rules.close()
    maps.close()
    assert not mismatches, mismatches[:10]
    assert len(outcomes) >= 40, "the corpus should exercise many distinct routes"


def _simulate_maps(maps: RouteMaps, host_header: str, path: str) -> str | None:
    """The map form's lookups in Python, with the semantics measured above (map_end: first in file)."""
    host = host_header.split(":", 1)[0].lower()
    host_class = (
        host
        if host in maps.exact_hosts
        else next((cls for suffix, cls in maps.wildcards if host.endswith(suffix)), "*")
    )
    key = host_class + path + "?"
    matches = [(k, v) for k, v in maps.entries if key.startswith(k)]
    return max(matches, key=lambda kv: len(kv[0]))[1] if matches else None


def test_map_layout_agrees_with_priority_order_on_a_large_random_corpus() -> None:
    rng = random.Random(5)
    labels = ["a", "b", "c", "x"]
    host_patterns = (
        [f"{a}.{b}.test" for a in labels for b in labels]
        + [f"*.{a}.test" for a in labels]
        + [f"*.{a}.{b}.test" for a in labels for b in labels[:2]]
    )
    segments = ["", "a", "b", "ab", "api", "v1"]

    def random_path() -> str:
        return "/" + "/".join(rng.choice(segments) for _ in range(rng.randrange(0, 4)))

    routes = tuple(
        route(
            i,
            rng.randrange(1000),
            random_path(),
            i,  # one pool per route: the key names the route
            hosts=tuple(rng.sample(host_patterns, rng.choice([0, 1, 1, 2, 3]))),
            match=rng.choice(["prefix", "exact"]),
        )
        for i in range(400)
    )
    maps = build_route_maps(routes)
    for _ in range(3000):
        host = rng.choice([*host_patterns, "q.a.test", "z.b.a.test", "c.test", "other.org"]).replace("*", "w")
        path = random_path() + rng.choice(["", "x", "/"])
        expected = resolve_route(routes, host, path)
        expected_key = None if expected is None else f"p{expected.targets[0].pool_id}"
        assert _simulate_maps(maps, host, path) == expected_key, (host, path, expected)


# --- runtime-applicable changes ---------------------------------------------------------------------


def test_a_route_change_alters_only_map_files_and_a_new_pool_alters_the_config() -> None:
    """What lets a route change skip the reload (node.hotchanges): same haproxy.cfg body."""
    from apps.fleets.config.render import render
    from apps.fleets.node.hotchanges import hot_map_changes
    from tests.fleets.config.renderkit import NODE, pool

    pools = (pool(1, {"eu": ()}), pool(2, {"eu": ()}))
    before = render(snapshot((listener(8080, (route(1, 1, "/a", 1),), default_pool_id=1),), pools), NODE)
    routes = (route(1, 1, "/a", 1), replace(route(2, 2, "/b", 1), hosts=("b.test",)))
    after = render(replace(snapshot((listener(8080, routes, default_pool_id=1),), pools), revision=2), NODE)

    changes = hot_map_changes(before, after)

    # The new class's bucket only: the any-host route's bucket keeps its file.
    b_routes = routes_map_name("maps/web.http", map_bucket("b.test"))
    assert changes is not None and set(changes) == {b_routes, "maps/web.http.hosts.map"}
    assert ("b.test/b/", "p1") in changes[b_routes]
    to_new_pool = (route(1, 1, "/a", 1), route(2, 2, "/b", 2))
    other = render(snapshot((listener(8080, to_new_pool, default_pool_id=1),), pools), NODE)
    assert hot_map_changes(before, other) is None, "a pool's first route adds its rules: reload"
