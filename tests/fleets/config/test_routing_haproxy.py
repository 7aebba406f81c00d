"""Routing semantics through a real HAProxy: PathPrefix per segment, the listener's no-route answer, and
every per-request decision equal to apps.balancers.routing.resolve_route on a 100k-route corpus."""

from __future__ import annotations

import http.client
import random
import time
from dataclasses import replace

import pytest

from apps.balancers.routing import normalize_host, resolve_route
from apps.fleets.config.spec import RouteSpec
from tests.fleets.config.renderkit import Client, backend_pool, listener, route, serve, snapshot

pytestmark = pytest.mark.haproxy


@pytest.mark.parametrize("threshold", [0, 10_000], ids=["maps", "rules"])
def test_prefix_api_serves_api_and_below_never_apix(haproxy_node, tiny_backend, free_port, threshold) -> None:
    a, b = tiny_backend("a"), tiny_backend("b")
    port = free_port()
    routes = (
        route(1, 10, "/api", 1, hosts=("example.com",)),
        route(2, 20, "/docs/", 2, hosts=("example.com",)),  # a trailing slash is ignored
        route(3, 30, "/v1", 2, hosts=("example.com",), match="exact"),
    )
    serve(haproxy_node, snapshot((listener(port, routes),), (backend_pool(1, a), backend_pool(2, b))),
          threshold=threshold)
    client = Client(port)
    assert [client.get(p) for p in ("/api", "/api/", "/api/v1?q=1", "/docs", "/docs/x", "/v1")] == ["a", "a", "a",
                                                                                                  "b", "b", "b"]
    assert [client.get(p) for p in ("/apix", "/api-v2", "/docsx", "/v1/", "/v1x")] == ["status 404"] * 5
    client.close()


def test_unknown_host_gets_the_listeners_small_no_route_answer(haproxy_node, tiny_backend, free_port) -> None:
    a = tiny_backend("a")
    default_port, custom_port = free_port(), free_port()
    routes = (route(1, 10, "/", 1, hosts=("example.com",)),)
    custom = listener(custom_port, routes, id=2, name="custom", no_route_status=421,
                      no_route_body="Misdirected: this host is not served here.")
    serve(haproxy_node, snapshot((listener(default_port, routes), custom), (backend_pool(1, a),)))

    for port, status, body in ((default_port, 404, "No route for this host and path."),
                               (custom_port, 421, "Misdirected: this host is not served here.")):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request("GET", "/", headers={"Host": "unknown.example.org"})
        response = conn.getresponse()
        assert (response.status, response.read().decode()) == (status, body)
        conn.close()
        assert Client(port).get("/", host="example.com") == "a"


def _corpus(rng: random.Random, count: int) -> tuple[RouteSpec, ...]:
    """Dense overlaps: 20 routes per host name, shared wildcards, `/api` beside `/apix`, exact beside prefix.
    Most routes redirect to a URL naming them, so a response identifies the exact route that served."""
    segments = ["api", "apix", "v1", "v1x", "static", "s"]
    routes = []
    for i in range(1, count + 1):
        host = f"h{i // 20}.t" if rng.random() < 0.9 else f"*.w{i // 400}.t"
        path = "/" + "/".join(rng.choice(segments) for _ in range(rng.randrange(0, 3)))
        match = "exact" if rng.random() < 0.3 else "prefix"
        if rng.random() < 0.8:
            routes.append(route(i, rng.randrange(1, 50_000), path, hosts=(host,), match=match,
                                redirect=f"https://r.test/{i}"))
        else:
            routes.append(route(i, rng.randrange(1, 50_000), path, rng.randrange(1, 4), hosts=(host,), match=match))
    return tuple(routes)


def test_every_decision_equals_the_python_rule_on_a_100k_route_corpus(haproxy_node, tiny_backend, free_port) -> None:
    rng = random.Random(1414)
    routes = _corpus(rng, 100_000)
    backends = [tiny_backend(f"b{i}") for i in range(1, 4)]
    port = free_port()
    started = time.perf_counter()
    serve(haproxy_node, snapshot((listener(port, routes),), tuple(backend_pool(i + 1, b) for i, b in
                                                                    enumerate(backends))))
    setup_s = time.perf_counter() - started

    by_host: dict[str, list[RouteSpec]] = {}
    for r in routes:
        by_host.setdefault(r.hosts[0], []).append(r)

    def expected(host: str, path: str) -> str:
        name = normalize_host(host)
        # Only routes naming this host or one of its wildcards can match (an index, not another rule).
        labels = name.split(".")
        candidates = [*by_host.get(name, ()),
                      *(r for i in range(1, len(labels)) for r in by_host.get("*." + ".".join(labels[i:]), ()))]
        hit = resolve_route(candidates, host, path)
        if hit is None:
            return "status 404"
        if hit.redirect_url:
            return "redirect " + hit.redirect_url
        return f"b{hit.targets[0].pool_id}"

    client = Client(port)
    mismatches, outcomes = [], set()
    for _ in range(1500):
        r = rng.choice(routes)
        host = r.hosts[0].replace("*", rng.choice(["x", "y.z"]))
        if rng.random() < 0.05:
            host = rng.choice(["unknown.t", "h1.t.evil", "w1.t"])
        base = r.path.rstrip("/") or "/r"
        path = rng.choice([r.path, base + "/", base + "x", base + "/api", base + "/apix/v1", "/", base + "/s?q=1"])
        want = expected(host, path.split("?")[0])
        outcomes.add(want)
        got = client.get(path, host)
        if got != want:
            mismatches.append((host, path, want, got))
    client.close()
    assert not mismatches, mismatches[:10]
    assert len(outcomes) > 500, "the sample should reach many distinct routes"
    print(f"100k routes: render + start {setup_s:.1f} s")


def test_map_and_rule_forms_agree_with_the_rule_on_apix_style_neighbours(haproxy_node, tiny_backend, free_port) -> None:
    """Small corpus, both forms: the rule form's `path /a || path_beg /a/` equals the map form's keys."""
    rng = random.Random(7)
    routes = tuple(replace(r, hosts=(r.hosts[0].replace("h", "k"),)) for r in _corpus(rng, 300))
    backends = [tiny_backend(f"b{i}") for i in range(1, 4)]
    pools = tuple(backend_pool(i + 1, b) for i, b in enumerate(backends))
    rule_port, map_port = free_port(), free_port()
    serve(haproxy_node, snapshot((listener(rule_port, routes),), pools), name="rules", threshold=10_000)
    serve(haproxy_node, snapshot((listener(map_port, routes),), pools), name="maps", threshold=0)
    rules, maps = Client(rule_port), Client(map_port)
    for r in routes[:150]:
        host = r.hosts[0].replace("*", "x")
        base = r.path.rstrip("/") or "/r"
        for path in (r.path, base + "x", base + "/v1"):
            hit = resolve_route(routes, host, path)
            want = ("status 404" if hit is None else
                    "redirect " + hit.redirect_url if hit.redirect_url else f"b{hit.targets[0].pool_id}")
            assert rules.get(path, host) == maps.get(path, host) == want, (host, path)
    rules.close()
    maps.close()
