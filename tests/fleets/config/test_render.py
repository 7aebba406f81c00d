"""The renderer: valid, deterministic, safe configs that route the way users were promised.

Behaviour tests run the rendered bundle in a real HAProxy 2.6 (pushed with LocalTransport and started
with apps.fleets.node.process, as production does) in front of tiny Python backends on 127.0.0.1.
"""

from __future__ import annotations

import hashlib
import http.client
import random
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import replace

import pytest

from apps.fleets.config.check import validate_bundle
from apps.fleets.config.render import UnsafeValue, render
from apps.fleets.config.spec import (
    CertSpec,
    FleetSnapshot,
    NodeSpec,
    RegionStep,
    RouteTargetSpec,
)
from tests.fleets.config.renderkit import (
    HEALTH,
    NODE,
    RULE_FORM,
    Client,
    backend_pool,
    listener,
    member,
    pool,
    rich_snapshot,
    route,
    self_signed_pem,
    serve,
    snapshot,
)

# --- rendering, pure ------------------------------------------------------------------------------


def test_rendered_configs_pass_haproxy_check_in_rule_and_map_form() -> None:
    snap = rich_snapshot()
    for threshold in (RULE_FORM, 0):
        result = validate_bundle(render(snap, NODE, route_map_threshold=threshold))
        assert result.ok, result.output
        assert "Configuration file is valid" in result.output


def test_same_input_gives_the_same_bytes_whatever_the_order() -> None:
    snap = rich_snapshot()
    first = render(snap, NODE)
    assert render(snap, NODE).files == first.files

    rng = random.Random(7)

    def shuffled(items: tuple) -> tuple:
        items = list(items)
        rng.shuffle(items)
        return tuple(items)

    mixed = replace(
        snap,
        listeners=shuffled(
            tuple(
                replace(
                    ln,
                    routes=shuffled(
                        tuple(replace(r, hosts=shuffled(r.hosts), targets=shuffled(r.targets)) for r in ln.routes)
                    ),
                )
                for ln in snap.listeners
            )
        ),
        pools=shuffled(
            tuple(
                replace(p, regions=shuffled(tuple(replace(r, members=shuffled(r.members)) for r in p.regions)))
                for p in snap.pools
            )
        ),
    )
    for threshold in (RULE_FORM, 0):
        a = render(snap, NODE, route_map_threshold=threshold)
        b = render(mixed, NODE, route_map_threshold=threshold)
        assert a.files == b.files
        assert a.sha256 == b.sha256


def test_header_names_fleet_and_node_and_its_hash_changes_with_content_only() -> None:
    """A new revision with the same haproxy.cfg body (a route change moves map files only) renders the very same
    haproxy.cfg: nodes then link it into their new set instead of writing it. Which revision a node serves is its
    served.json, which the header points to."""
    snap = rich_snapshot()
    bundle = render(snap, NODE)
    head = bundle.main.splitlines()[:3]
    assert "fleet edge" in head[0] and f"node {NODE.name}" in head[0] and "revision 1" not in head[0]
    assert "served.json" in head[1]
    assert head[2] == "# " + hashlib.sha256(bundle.body.encode()).hexdigest()
    bumped = render(replace(snap, revision=2), NODE)
    assert bumped.files["haproxy.cfg"] == bundle.files["haproxy.cfg"]
    changed = render(replace(snap, pools=(*snap.pools[:3], pool(4, {"eu": (member("x", 9100),)}))), NODE)
    assert changed.main.splitlines()[2] != head[2]
    assert len(bundle.sha256) == 64 and bundle.sha256 != changed.sha256


def test_config_declares_the_runtime_pieces_nodes_rely_on() -> None:
    text = render(rich_snapshot(), NODE).main
    for line in (
        "master-worker",
        "stats socket /var/lib/spillway/n1/stats.sock mode 600 level admin expose-fd listeners",
        "server-state-file /var/lib/spillway/n1/server-state",
        "load-server-state-from-file global",
        "option idle-close-on-response",
        "http-reuse safe",
        "retry-on conn-failure empty-response response-timeout",
        "retries 2",
        "option redispatch",
        "bind 127.0.0.1:8443 ssl crt certs/example.pem",
    ):
        assert line in text, line


def test_certificates_ship_in_the_bundle_and_bind_address_overrides_listeners() -> None:
    snap = rich_snapshot()
    bundle = render(snap, replace(NODE, bind_address="127.0.0.42"))
    assert bundle.files["certs/example.pem"] == snap.listeners[1].cert.pem  # type: ignore[union-attr]
    assert bundle.is_secret("certs/example.pem")
    binds = [line.strip() for line in bundle.main.splitlines() if line.strip().startswith("bind ")]
    assert binds and all(b.startswith("bind 127.0.0.42:") for b in binds)


def test_overflow_chain_is_map_data_not_one_rule_set_per_pool() -> None:
    bundle = render(rich_snapshot(), NODE)
    text = bundle.main
    frontend = text.split("frontend fe_web.http")[1].split("\nbackend")[0]
    assert not [line for line in frontend.splitlines() if "use_backend p1_" in line]
    assert "use_backend %[var(txn.be)] if { var(txn.be) -m found }" in frontend
    assert b"1 p1_eu\n" in bundle.files["maps/chain.first.map"]
    assert b"p1_eu p1_us\n" in bundle.files["maps/chain.next.map"]
    limits = bundle.files["maps/chain.limits.map"].decode().splitlines()
    assert "p1_eu 20" in limits and "p1_us 1000000000" in limits
    tcp = text.split("frontend fe_web.db")[1].split("\nbackend")[0]
    assert "default_backend p3_eu_tcp" in tcp
    assert "backend p3_eu_tcp" in text


def test_member_states_render_as_haproxy_understands_them() -> None:
    text = render(rich_snapshot(), NODE).main
    assert "server a 127.0.0.1:9001 weight 100 check" in text
    assert "server b 127.0.0.1:9002 weight 0 check" in text  # drain
    assert "server a 127.0.0.1:9004 weight 100 disabled" in text  # maint
    assert "option httpchk GET /healthz" in text and "http-check expect status 200" in text


def test_duplicate_bind_after_bind_address_override_is_refused() -> None:
    snap = snapshot(
        (
            listener(8080, default_pool_id=1),
            listener(8080, default_pool_id=1, id=2, name="b", address="127.0.0.2"),
        ),
        (pool(1, {"eu": (member("a", 9001),)}),),
    )
    assert render(snap, NODE)
    with pytest.raises(UnsafeValue) as excinfo:
        render(snap, replace(NODE, bind_address="127.0.0.9"))
    assert excinfo.value.code == "duplicate_bind"


# --- injection corpus -----------------------------------------------------------------------------

BAD_STRINGS = [
    "a\nb",
    "a\rb",
    "a\u2028b",
    "a\u2029b",
    "a\x00b",
    "a b",
    "a\tb",
    "a#b",
    "a{b",
    "a}b",
    'a"b',
    "a'b",
    "a\\b",
    "x" * 10_000,
]


def _string_fields() -> dict[str, Callable[[str], tuple[FleetSnapshot, NodeSpec]]]:
    snap = rich_snapshot()
    ln, p1 = snap.listeners[0], snap.pools[0]
    r0 = ln.routes[0]
    eu = p1.regions[0]

    def with_listener(**kw) -> FleetSnapshot:
        return replace(snap, listeners=(replace(ln, **kw), *snap.listeners[1:]))

    def with_route(**kw) -> FleetSnapshot:
        return with_listener(routes=(replace(r0, **kw), *ln.routes[1:]))

    def with_pool(**kw) -> FleetSnapshot:
        return replace(snap, pools=(replace(p1, **kw), *snap.pools[1:]))

    def with_member(**kw) -> FleetSnapshot:
        return with_pool(
            regions=(replace(eu, members=(replace(eu.members[0], **kw), *eu.members[1:])), *p1.regions[1:])
        )

    def just(s: FleetSnapshot) -> tuple[FleetSnapshot, NodeSpec]:
        return s, NODE

    https = snap.listeners[1]
    return {
        "fleet": lambda v: just(replace(snap, fleet=v)),
        "region": lambda v: just(replace(snap, region=v)),
        "listener.lb": lambda v: just(with_listener(lb=v)),
        "listener.name": lambda v: just(with_listener(name=v)),
        "listener.protocol": lambda v: just(with_listener(protocol=v)),
        "listener.address": lambda v: just(with_listener(address=v)),
        "route.host": lambda v: just(with_route(hosts=(v,))),
        "route.path": lambda v: just(with_route(path=v)),
        "route.path_match": lambda v: just(with_route(path_match=v)),
        "route.redirect_url": lambda v: just(with_route(redirect_url=v)),
        "cert.name": lambda v: just(
            replace(snap, listeners=(ln, replace(https, cert=replace(https.cert, name=v)), *snap.listeners[2:]))
        ),  # type: ignore[arg-type]
        "pool.name": lambda v: just(with_pool(name=v)),
        "pool.algorithm": lambda v: just(with_pool(algorithm=v)),
        "pool.region": lambda v: just(with_pool(regions=(replace(eu, region=v), *p1.regions[1:]))),
        "pool.chain.region": lambda v: just(with_pool(chain=(RegionStep(v, None),))),
        "health.path": lambda v: just(with_pool(health=replace(HEALTH, path=v))),
        "member.name": lambda v: just(with_member(name=v)),
        "member.address": lambda v: just(with_member(address=v)),
        "member.admin_state": lambda v: just(with_member(admin_state=v)),
        "node.name": lambda v: (snap, replace(NODE, name=v)),
        "node.runtime_dir": lambda v: (snap, replace(NODE, runtime_dir="/var/lib/" + v)),
        "node.bind_address": lambda v: (snap, replace(NODE, bind_address=v)),
    }


@pytest.mark.parametrize("field", sorted(_string_fields()))
def test_every_string_field_refuses_the_injection_corpus(field: str) -> None:
    make = _string_fields()[field]
    for bad in BAD_STRINGS:
        value = bad if field != "route.path" and field != "health.path" else "/" + bad
        snap, node = make(value)
        with pytest.raises(UnsafeValue) as excinfo:
            render(snap, node)
        assert isinstance(excinfo.value, ValueError)
        assert excinfo.value.field, field


def test_unsafe_value_names_the_field_path() -> None:
    snap = rich_snapshot()
    bad_route = replace(snap.listeners[0].routes[1], path="/x }\nbind :1\n")
    snap = replace(
        snap,
        listeners=(
            replace(snap.listeners[0], routes=(snap.listeners[0].routes[0], bad_route)),
            *snap.listeners[1:],
        ),
    )
    with pytest.raises(UnsafeValue) as excinfo:
        render(snap, NODE)
    assert excinfo.value.field == "listeners[0].routes[1].path"
    assert excinfo.value.code == "invalid_path"


def test_integers_out_of_range_are_refused() -> None:
    snap = rich_snapshot()
    p1 = snap.pools[0]
    eu = p1.regions[0]
    for bad in (
        replace(snap, listeners=(replace(snap.listeners[0], port=0), *snap.listeners[1:])),
        replace(snap, listeners=(replace(snap.listeners[0], port=True), *snap.listeners[1:])),
        replace(
            snap,
            pools=(
                replace(p1, regions=(replace(eu, members=(replace(eu.members[0], weight=257),)),)),
                *snap.pools[1:],
            ),
        ),
        replace(snap, pools=(replace(p1, chain=(RegionStep("eu", -1),)), *snap.pools[1:])),
        replace(snap, pools=(replace(p1, chain=(RegionStep("mars", None),)), *snap.pools[1:])),
    ):
        with pytest.raises(UnsafeValue):
            render(bad, NODE)


# --- behaviour through a real HAProxy -------------------------------------------------------------


@pytest.mark.haproxy
def test_priority_decides_between_overlapping_routes(haproxy_node, tiny_backend, free_port) -> None:
    a, b = tiny_backend("a"), tiny_backend("b")
    port = free_port()
    pools = (backend_pool(1, a), backend_pool(2, b))
    routes = (
        route(1, 20, "/api", 1),
        route(2, 10, "/api/v2", 2),  # more specific and evaluated first
        route(3, 5, "/api/v1/special", 1, match="exact"),
        route(4, 30, "/api/v1", 2),  # shadowed by route 1 for everything under /api
    )
    serve(haproxy_node, snapshot((listener(port, routes),), pools))
    client = Client(port)
    assert client.get("/api/v2/users") == "b"
    assert client.get("/api/v1/users") == "a"
    assert client.get("/api/v1/special") == "a"
    assert client.get("/api") == "a"
    assert client.get("/nothing") == "status 404"  # no route, no default pool: the listener's no-route answer
    client.close()


@pytest.mark.haproxy
def test_hosts_exact_and_wildcard_and_path_exact_vs_prefix(haproxy_node, tiny_backend, free_port) -> None:
    a, b, c = tiny_backend("a"), tiny_backend("b"), tiny_backend("c")
    port = free_port()
    pools = (backend_pool(1, a), backend_pool(2, b), backend_pool(3, c))
    routes = (
        route(1, 10, "/", 1, hosts=("*.example.com",)),
        route(2, 20, "/", 2, hosts=("example.com",)),
        route(3, 5, "/exact", 3, match="exact", hosts=("example.com",)),
        route(4, 40, "/old", redirect="https://example.com/new%20page?x=1"),
    )
    serve(haproxy_node, snapshot((listener(port, routes, default_pool_id=3),), pools))
    client = Client(port)
    assert client.get("/", host="www.example.com") == "a"
    assert client.get("/", host="a.b.example.com") == "a"  # one or more labels below
    assert client.get("/", host="example.com") == "b"  # the wildcard does not cover the apex
    assert client.get("/", host="EXAMPLE.com:8080") == "b"  # port stripped, case folded
    assert client.get("/", host="badexample.com") == "c"  # default pool
    assert client.get("/exact", host="example.com") == "c"
    assert client.get("/exact?q=1", host="example.com") == "c"  # the query is not part of the path
    assert client.get("/exact/more", host="example.com") == "b"
    assert client.get("/exactly", host="example.com") == "b"
    assert client.get("/old/x", host="other.org") == "redirect https://example.com/new%20page?x=1"
    client.close()


@pytest.mark.haproxy
def test_canary_split_sends_about_ten_percent(haproxy_node, tiny_backend, free_port) -> None:
    stable, canary = tiny_backend("stable"), tiny_backend("canary")
    port = free_port()
    pools = (backend_pool(1, stable), backend_pool(2, canary))
    routes = (route(1, 1, "/", targets=(RouteTargetSpec(1, 90), RouteTargetSpec(2, 10))),)
    serve(haproxy_node, snapshot((listener(port, routes),), pools))
    client = Client(port)
    seen = Counter(client.get("/") for _ in range(1000))
    client.close()
    assert set(seen) == {"stable", "canary"}
    # Binomial(1000, 0.1) has a standard deviation of 9.5: 60..140 is more than 4 sigma either way.
    assert 60 <= seen["canary"] <= 140, seen


@pytest.mark.haproxy
def test_overflow_sends_the_rate_limit_to_the_near_region_and_the_rest_onward(
        haproxy_node, tiny_backend, free_port) -> None:
    near, far = tiny_backend("near"), tiny_backend("far")
    port = free_port()
    limit_per_s, offered_per_s, duration_s = 20, 60, 3.0
    overflow_pool = pool(
        1,
        {"eu": (member("near", near.port),), "us": (member("far", far.port),)},
        chain=(RegionStep("eu", limit_per_s), RegionStep("us", None)),
    )
    serve(haproxy_node, snapshot((listener(port, default_pool_id=1),), (overflow_pool,)))
    client = Client(port)
    seen: Counter[str] = Counter()
    started = time.monotonic()
    for i in range(int(offered_per_s * duration_s)):
        # Paced, not bursty: request i leaves at i/offered_per_s seconds.
        delay = started + i / offered_per_s - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        seen[client.get("/")] += 1
    elapsed_s = time.monotonic() - started
    client.close()
    # On a busy machine the loop can fall behind its pace; the limit is per second of wall time.
    assert offered_per_s * duration_s / elapsed_s >= 2 * limit_per_s, f"could not offer load: {elapsed_s:.1f}s"
    expected_near = limit_per_s * elapsed_s
    assert abs(seen["near"] - expected_near) <= 0.2 * expected_near, seen
    assert seen["near"] + seen["far"] == offered_per_s * duration_s, seen


@pytest.mark.haproxy
def test_a_region_whose_members_are_all_in_maint_overflows_entirely(haproxy_node, tiny_backend, free_port) -> None:
    near, far = tiny_backend("near"), tiny_backend("far")
    port = free_port()
    overflow_pool = pool(
        1,
        {"eu": (member("near", near.port, state="maint"),), "us": (member("far", far.port),)},
        chain=(RegionStep("eu", 1000), RegionStep("us", None)),
    )
    serve(haproxy_node, snapshot((listener(port, default_pool_id=1),), (overflow_pool,)))
    client = Client(port)
    assert Counter(client.get("/") for _ in range(50)) == {"far": 50}
    client.close()


@pytest.mark.haproxy
def test_drained_members_get_no_new_requests(haproxy_node, tiny_backend, free_port) -> None:
    a, b = tiny_backend("a"), tiny_backend("b")
    port = free_port()
    p = pool(1, {"eu": (member("a", a.port), member("b", b.port, state="drain"))})
    serve(haproxy_node, snapshot((listener(port, default_pool_id=1),), (p,)))
    client = Client(port)
    assert Counter(client.get("/") for _ in range(30)) == {"a": 30}
    client.close()


@pytest.mark.haproxy
def test_https_and_tcp_listeners_serve(haproxy_node, tiny_backend, free_port) -> None:
    import ssl

    a, b = tiny_backend("a"), tiny_backend("b")
    https_port, tcp_port = free_port(), free_port()
    pools = (backend_pool(1, a), backend_pool(2, b))
    snap = snapshot(
        (
            listener(
                https_port,
                (route(1, 1, "/b", 2),),
                default_pool_id=1,
                protocol="https",
                cert=CertSpec(name="site", pem=self_signed_pem()),
            ),
            listener(tcp_port, default_pool_id=2, id=2, name="raw", protocol="tcp"),
        ),
        pools,
    )
    serve(haproxy_node, snap)
    context = ssl.create_default_context()
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    conn = http.client.HTTPSConnection("127.0.0.1", https_port, timeout=5, context=context)
    conn.request("GET", "/b/x", headers={"Host": "example.com"})
    assert conn.getresponse().read() == b"b"
    conn.close()
    assert Client(tcp_port).get("/anything") == "b"
