"""guard._route_fast (the cold-render shortcut) accepts only what the full route check accepts, and returns
the same value; anything else falls through to the full check, which names the field."""

from __future__ import annotations

import pytest

from apps.fleets import caches
from apps.fleets.config.render import guard
from apps.fleets.config.spec import RouteSpec, RouteTargetSpec


def _route(**changes: object) -> RouteSpec:
    fields: dict[str, object] = dict(id=7, priority=3, hosts=("b.example.com", "a.example.com"), path_match="prefix",
                                     path="/api", targets=(RouteTargetSpec(1, 100),))
    fields.update(changes)
    return RouteSpec(**fields)  # type: ignore[arg-type]


CASES = [
    _route(),
    _route(hosts=("A.Example.COM", "a.example.com")),  # normalised: lower-cased, deduplicated, sorted
    _route(hosts=()),
    _route(hosts=("*.example.com",)),
    _route(path_match="exact", path="/"),
    _route(targets=(RouteTargetSpec(1, 90), RouteTargetSpec(2, 10))),
    _route(targets=(RouteTargetSpec(1, 0), RouteTargetSpec(2, 0))),  # no weight: refused
    _route(targets=()),
    _route(id=True),  # bool is not an id
    _route(id=-1),
    _route(priority=10**10),
    _route(path="/a b"),
    _route(path="api"),
    _route(path_match="regex"),
    _route(hosts=("bad host",)),
    _route(hosts=["a.example.com"]),  # a list where a tuple belongs
    _route(hosts=(1,)),
    _route(targets=(RouteTargetSpec(1, 10**7),)),
    _route(redirect_url="https://example.com/", targets=()),
]


@pytest.mark.parametrize("route", CASES)
def test_fast_check_agrees_with_the_full_check(route: RouteSpec) -> None:
    try:
        full = guard._check_route_values("r", route)
    except guard.UnsafeValue:
        assert guard._route_fast(route) is None
        with pytest.raises(guard.UnsafeValue):
            guard.check_route("r", route, {1, 2})
        return
    fast = guard._route_fast(route)
    assert fast is None or fast == full
    caches.reset("checked_routes")
    assert guard.check_route("r", route, {1, 2}) == full


def test_common_routes_take_the_shortcut() -> None:
    route = _route(hosts=("a.example.com",))
    assert guard._route_fast(route) is route
    assert guard._route_fast(_route()) == guard._check_route_values("r", _route())
