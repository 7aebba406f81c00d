"""The routing rule (apps.balancers.routing) and how route saves enforce it through the API."""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import pytest

from apps.balancers import routing
from apps.balancers.models import Route
from tests.factories import PoolFactory


@dataclass(frozen=True)
class R:
    id: int
    priority: int
    path: str
    hosts: tuple[str, ...] = ()
    path_match: str = "prefix"


# --- the pure rule ------------------------------------------------------------------------------------


def test_prefix_is_path_prefix_per_segment_and_exact_is_exact() -> None:
    api, slash_api, root, exact = R(1, 1, "/api"), R(2, 1, "/api/"), R(3, 1, "/"), R(4, 1, "/api", path_match="exact")
    for route in (api, slash_api):
        assert [routing.path_matches(route, p) for p in ("/api", "/api/", "/api/v1", "/apix", "/ap", "/")] == [
            True, True, True, False, False, False]
    assert all(routing.path_matches(root, p) for p in ("/", "/x", "/api/v1"))
    assert [routing.path_matches(exact, p) for p in ("/api", "/api/", "/apix")] == [True, False, False]


def test_host_routes_rank_before_any_host_routes_whatever_their_priority() -> None:
    any_host = R(1, 1, "/")
    named = R(2, 900, "/", hosts=("a.test",))
    assert routing.resolve_route([any_host, named], "A.test:8080", "/x") == named
    assert routing.resolve_route([any_host, named], "b.test", "/x") == any_host


def test_shadowing_names_the_covering_route_and_only_when_nothing_is_left() -> None:
    root = R(1, 10, "/", hosts=("a.test",))
    wild = R(2, 5, "/api", hosts=("*.a.test",))
    assert routing.shadowing_routes([root], R(9, 20, "/api", hosts=("a.test",))) == [root]
    assert routing.shadowing_routes([root], R(9, 5, "/api", hosts=("a.test",))) == []  # ranks first
    assert routing.shadowing_routes([root], R(9, 20, "/api", hosts=("a.test", "b.test"))) == []  # b.test serves
    assert routing.shadowing_routes([wild], R(9, 6, "/api/v1", hosts=("x.a.test", "*.b.a.test"))) == [wild]
    assert routing.shadowing_routes([wild], R(9, 6, "/apix", hosts=("x.a.test",))) == []  # not under /api
    assert routing.shadowing_routes([wild], R(9, 6, "/api", hosts=("a.test",))) == []  # apex not covered
    exact = R(3, 1, "/api", hosts=("a.test",), path_match="exact")
    assert routing.shadowing_routes([exact], R(9, 2, "/api", hosts=("a.test",))) == []  # /api/x still serves
    assert routing.newly_shadowed([R(5, 20, "/api", hosts=("a.test",))], root) == [R(5, 20, "/api", hosts=("a.test",))]


def test_shadowing_agrees_with_brute_force_on_a_random_corpus() -> None:
    """A route is reported shadowed exactly when no request of a covering sample resolves to it."""
    rng = random.Random(14)
    patterns = ["a.t", "b.a.t", "*.a.t", "*.b.a.t", "c.t"]
    paths = ["/", "/a", "/a/b", "/ab", "/a/b/c"]
    sample_hosts = ["a.t", "b.a.t", "x.b.a.t", "y.a.t", "c.t", "z.t"]
    sample_paths = sorted({p for base in paths for p in (base, base.rstrip("/") + "/", base + "x", base + "/q")})
    for trial in range(300):
        routes = [R(i, rng.randrange(1, 30), rng.choice(paths), tuple(rng.sample(patterns, rng.choice([0, 1, 1, 2]))),
                    rng.choice(["prefix", "exact"])) for i in range(rng.randrange(2, 7))]
        candidate = routes[-1]
        serves = any(routing.resolve_route(routes, h, p) == candidate
                     for h, p in itertools.product(sample_hosts, sample_paths))
        assert (not routing.shadowing_routes(routes[:-1], candidate)) == serves, (trial, routes)


def test_a_write_loading_only_its_path_line_decides_as_with_every_route() -> None:
    """route_save loads only the routes routing.related_bases names (SQL: rtrim(path, '/') among the
    ancestors or under the base): both shadowing checks must come out as with the whole scope loaded."""
    rng = random.Random(140)
    paths = ["/", "/a", "/a/", "/a/b", "/a/b/", "/ab", "/a/b/c", "/a%b", "/a_b", "/x/a", "/a//b", "/a/bc"]
    for trial in range(2000):
        routes = [R(i, rng.randrange(1, 30), rng.choice(paths), (), rng.choice(["prefix", "exact"]))
                  for i in range(rng.randrange(2, 9))]
        candidate = routes[-1]
        ancestors, base = routing.related_bases(candidate.path)
        loaded = [r for r in routes[:-1] if base is None or routing.prefix_base(r.path) in ancestors
                  or routing.prefix_base(r.path).startswith(base + "/")]
        assert routing.shadowing_routes(loaded, candidate) == routing.shadowing_routes(routes[:-1], candidate), trial
        assert routing.newly_shadowed(loaded, candidate) == routing.newly_shadowed(routes[:-1], candidate), trial


def test_a_write_loading_only_related_hosts_decides_as_with_every_host_route() -> None:
    """route_save loads, of a tenant's host routes, those holding a pattern routing.related_hosts names (SQL: the
    hosts array holds one of the covering patterns, or a name under one of the candidate's wildcards), then those
    covering the other hosts of the routes it could leave never serving (routing.hosts_behind): both shadowing
    checks must come out as with every host route loaded."""
    rng = random.Random(41)
    hosts = ["a.t", "b.a.t", "c.b.a.t", "*.a.t", "*.b.a.t", "*.t", "x.t", "*.x.t", "y.x.t", "b.t", "ab.t", "*.b.t"]
    paths = ["/", "/a", "/a/b", "/b"]
    for trial in range(3000):
        routes = [R(i, rng.randrange(1, 12), rng.choice(paths), tuple(rng.sample(hosts, rng.choice([1, 1, 2, 3]))),
                    rng.choice(["prefix", "exact"])) for i in range(rng.randrange(2, 10))]
        candidate, others = routes[-1], routes[:-1]
        covering, below = routing.related_hosts(candidate.hosts)
        first = [r for r in others if routing.host_related(r.hosts, covering, below)]
        behind = routing.hosts_behind(first, candidate)
        loaded = first + [r for r in others if r not in first and routing.host_related(r.hosts, behind, [])]
        assert routing.shadowing_routes(loaded, candidate) == routing.shadowing_routes(others, candidate), trial
        assert set(routing.newly_shadowed(loaded, candidate)) == set(routing.newly_shadowed(others, candidate)), (
            trial, routes)


def test_default_priorities_put_longer_paths_first_and_exact_before_prefix() -> None:
    taken: set[int] = set()
    order = []
    for path, match in [("/", "prefix"), ("/api", "prefix"), ("/api", "exact"), ("/api/v1", "prefix"),
                        ("/api/v2", "prefix")]:
        priority = routing.default_priority(path, match, taken)
        taken.add(priority)
        order.append((priority, path, match))
    assert [p for _, p, _ in sorted(order)] == ["/api/v1", "/api/v2", "/api", "/api", "/"]
    assert sorted(order)[2][2] == "exact"


def test_a_full_band_spills_upward_and_then_below_the_band() -> None:
    base = routing.default_priority("/api", "prefix", set())
    assert routing.default_priority("/api", "prefix", {base}) == base + 1
    everything_above = set(range(base, routing.MAX_PRIORITY + 1))
    assert routing.default_priority("/api", "prefix", everything_above) == base - 1
    with pytest.raises(ValueError, match="no free priority"):
        routing.default_priority("/api", "prefix", set(range(1, routing.MAX_PRIORITY + 1)))


# --- through the API ------------------------------------------------------------------------------------


def _route(lb, pool, **kw) -> dict:
    return {"lb": lb.pk, "hosts": ["acme.example.com"], "targets": [{"pool": pool.pk, "weight": 100}], **kw}


@pytest.mark.django_db
def test_a_route_that_could_never_match_is_refused_naming_the_route_that_shadows_it(world, alice) -> None:
    root = alice.client.post("/api/v1/routes/", _route(world.acme_lb, world.acme_pool, path="/", priority=20),
                             format="json").json()
    shadowed = alice.client.post("/api/v1/routes/", _route(world.acme_lb, world.acme_pool, path="/api", priority=60),
                                 format="json")
    assert shadowed.status_code == 422
    body = shadowed.json()
    assert body["code"] == "route_shadowed" and "priority" in body["fields"]
    assert f"route {root['id']} (priority 20" in body["detail"]
    served = alice.client.post("/api/v1/routes/", _route(world.acme_lb, world.acme_pool, path="/api", priority=10),
                               format="json")
    assert served.status_code == 201
    # Moving the root route ahead of /api would leave /api never serving: refused as well.
    moved = alice.client.patch(f"/api/v1/routes/{root['id']}/", {"priority": 5}, format="json")
    assert (moved.status_code, moved.json()["code"]) == (422, "route_shadows")
    assert f"route {served.json()['id']}" in moved.json()["detail"]


@pytest.mark.django_db
def test_host_route_writes_refuse_exactly_what_the_rule_over_every_route_refuses(world, alice) -> None:
    """A route write loads only the host routes related to its own hosts (SQL), yet answers as the routing rule
    does over every route of the LB: a conflict, a route that would never serve, or one it would leave never
    serving; random sets of the tenant's routes with nested names and wildcards."""
    # The route a write would leave never serving may owe its other host's cover to a route sharing no host with
    # the write: x.acme.test/ covers /a's second name, the new a.acme.test/ its first.
    org = world.acme_lb.org
    Route.objects.bulk_create([
        Route(lb=world.acme_lb, org=org, priority=30, path="/a", hosts=["a.acme.test", "x.acme.test"]),
        Route(lb=world.acme_lb, org=org, priority=10, path="/", hosts=["x.acme.test"])])
    answer = alice.client.post("/api/v1/routes/", _route(world.acme_lb, world.acme_pool, hosts=["a.acme.test"],
                                                         path="/", priority=20), format="json")
    assert (answer.status_code, answer.json()["code"]) == (422, "route_shadows"), answer.content
    Route.objects.filter(lb=world.acme_lb).delete()
    rng = random.Random(7)
    names = ["a.acme.test", "b.a.acme.test", "c.b.a.acme.test", "*.a.acme.test", "*.b.a.acme.test", "*.acme.test",
             "x.acme.test", "*.x.acme.test", "y.x.acme.test"]
    paths = ["/", "/a", "/a/b", "/b"]
    outcomes = set()
    for trial in range(40):
        priorities = rng.sample(range(1, 60), 9)
        rows = Route.objects.bulk_create([
            Route(lb=world.acme_lb, org=world.acme_lb.org, priority=priorities[i], path=rng.choice(paths),
                  hosts=sorted(rng.sample(names, rng.choice([1, 1, 2, 3]))), path_match=rng.choice(["prefix", "exact"]))
            for i in range(rng.randrange(2, 9))])
        others = [R(r.pk, r.priority, r.path, tuple(r.hosts), r.path_match) for r in rows]
        hosts, path, match = sorted(rng.sample(names, rng.choice([1, 2]))), rng.choice(paths), rng.choice(
            ["prefix", "exact"])
        candidate = R(2**62, priorities[-1], path, tuple(hosts), match)
        if any(o.path == path and o.path_match == match and set(o.hosts) & set(hosts) for o in others):
            expected = "route_conflict"
        elif routing.shadowing_routes(others, candidate):
            expected = "route_shadowed"
        elif routing.newly_shadowed(others, candidate):
            expected = "route_shadows"
        else:
            expected = "created"
        answer = alice.client.post("/api/v1/routes/", _route(world.acme_lb, world.acme_pool, hosts=hosts, path=path,
                                                             path_match=match, priority=candidate.priority),
                                   format="json")
        got = "created" if answer.status_code == 201 else answer.json()["code"]
        assert got == expected, (trial, others, candidate, answer.content)
        outcomes.add(got)
        Route.objects.filter(lb=world.acme_lb).delete()
    assert outcomes == {"route_conflict", "route_shadowed", "route_shadows", "created"}


@pytest.mark.django_db
def test_priorities_are_per_tenant_on_a_shared_lb_and_reveal_nothing(world, alice, charlie, globex) -> None:
    globex_pool = PoolFactory(lb=world.edge, org=globex, name="globex-web")
    theirs = charlie.client.post("/api/v1/routes/", {
        "lb": world.edge.pk, "hosts": ["globex.example.com"], "path": "/", "priority": 200,
        "targets": [{"pool": globex_pool.pk, "weight": 100}]}, format="json")
    assert theirs.status_code == 201, theirs.content
    mine = alice.client.post("/api/v1/routes/", _route(world.edge, world.edge_pool, path="/", priority=200),
                             format="json")
    assert mine.status_code == 201, mine.content  # the same number, another tenant: no collision
    again = alice.client.post("/api/v1/routes/", _route(world.edge, world.edge_pool, path="/x", priority=200),
                              format="json")
    assert (again.status_code, again.json()["code"]) == (409, "priority_taken")
    assert "your routes" in again.json()["detail"]


@pytest.mark.django_db
def test_an_operator_catch_all_never_shadows_a_tenant_route_and_is_not_named(world, alice, otto, ops) -> None:
    ops_pool = PoolFactory(lb=world.edge, org=ops, name="ops-web")
    catch_all = otto.client.post("/api/v1/routes/", {
        "lb": world.edge.pk, "hosts": [], "path": "/", "priority": 1, "org": ops.slug,
        "targets": [{"pool": ops_pool.pk, "weight": 100}]}, format="json")
    assert catch_all.status_code == 201, catch_all.content
    mine = alice.client.post("/api/v1/routes/", _route(world.edge, world.edge_pool, path="/", priority=9000),
                             format="json")
    assert mine.status_code == 201, mine.content  # host routes rank before any-host ones
    second = otto.client.post("/api/v1/routes/", {
        "lb": world.edge.pk, "hosts": [], "path": "/ops", "priority": 2, "org": ops.slug,
        "targets": [{"pool": ops_pool.pk, "weight": 100}]}, format="json")
    assert (second.status_code, second.json()["code"]) == (422, "route_shadowed")


@pytest.mark.django_db
def test_omitted_priority_gets_a_free_one_longest_path_first(world, alice) -> None:
    created = {}
    for path in ("/", "/api", "/api/v1"):
        response = alice.client.post("/api/v1/routes/", _route(world.acme_lb, world.acme_pool, path=path),
                                     format="json")
        assert response.status_code == 201, response.content
        created[path] = response.json()["priority"]
    assert created["/api/v1"] < created["/api"] < created["/"]
    assert Route.objects.filter(lb=world.acme_lb).count() == 3
