"""Provider limits are refused up front, with a sentence naming the limit (pure: no cdktf needed)."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from deploy.limits import LimitViolation, check_limits, gcp_url_map_bytes
from deploy.model import CloudMember, CloudPoolRegion, CloudRoute, RouteTarget
from tests.cloud.cloudkit import demo_aws_lb, demo_gcp_lb, many_routes

REPO = Path(__file__).resolve().parents[2]


def _codes(violations: list[LimitViolation]) -> list[str]:
    return [v.code for v in violations]


def _with_pool_region(lb, pool_name: str, region: str, **changes):
    pools = tuple(
        replace(p, regions=tuple(replace(pr, **changes) if pr.region == region else pr for pr in p.regions))
        if p.name == pool_name else p
        for p in lb.pools)
    return replace(lb, pools=pools)


def test_the_demo_load_balancers_are_within_every_limit() -> None:
    assert check_limits(demo_gcp_lb()) == []
    assert check_limits(demo_aws_lb()) == []


# --- AWS ----------------------------------------------------------------------------------------------------

def test_aws_refuses_more_rules_than_the_alb_quota_and_says_how_many() -> None:
    lb = demo_aws_lb(routes=many_routes(131), listeners=demo_aws_lb().listeners[:1])
    (violation,) = check_limits(lb)
    assert violation.code == "aws_rules_per_alb"
    assert violation.limit == 100
    assert "AWS ALB allows at most 100 rules per load balancer" in violation.message
    assert "needs 131" in violation.message


def test_aws_counts_rules_on_every_listener() -> None:
    # 60 routes on the demo's two listeners are 120 rules on each regional ALB.
    (violation,) = check_limits(demo_aws_lb(routes=many_routes(60)))
    assert violation.code == "aws_rules_per_alb"
    assert "needs 120 (60 routes x 2 listeners)" in violation.message
    assert check_limits(demo_aws_lb(routes=many_routes(50))) == []


def test_a_raised_aws_rule_quota_is_honoured() -> None:
    lb = demo_aws_lb(routes=many_routes(131), listeners=demo_aws_lb().listeners[:1])
    assert check_limits(lb, aws_rules_per_alb=200) == []


@pytest.mark.parametrize(("priority", "ok"), [(0, False), (1, True), (50_000, True), (50_001, False)])
def test_aws_rule_priorities_are_1_to_50000(priority: int, ok: bool) -> None:
    lb = demo_aws_lb(routes=many_routes(1, first_priority=priority))
    assert _codes(check_limits(lb)) == ([] if ok else ["aws_rule_priority"])


def test_aws_allows_five_condition_values_per_rule_hosts_plus_path() -> None:
    assert check_limits(demo_aws_lb(routes=many_routes(1, hosts_per_route=4))) == []
    (violation,) = check_limits(demo_aws_lb(routes=many_routes(1, hosts_per_route=5)))
    assert violation.code == "aws_condition_values"
    assert violation.limit == 5
    assert "needs 6 (5 hosts + 1 path)" in violation.message
    assert "Split it into routes of at most 4 hosts" in violation.message


def test_aws_allows_five_weighted_target_groups_with_weights_up_to_999() -> None:
    pools = tuple(replace(demo_aws_lb().pools[0], name=f"p{i}") for i in range(6))

    def lb(targets):
        return demo_aws_lb(pools=pools, routes=(CloudRoute(1, (), "prefix", "/", targets),),
                           listeners=(replace(demo_aws_lb().listeners[0], default_pool="p0"),))

    assert check_limits(lb(tuple(RouteTarget(f"p{i}", 999) for i in range(5)))) == []
    six = tuple(RouteTarget(f"p{i}", 1) for i in range(6))
    assert _codes(check_limits(lb(six))) == ["aws_targets_per_action"]
    (violation,) = check_limits(lb((RouteTarget("p0", 1000), RouteTarget("p1", 0))))
    assert violation.code == "aws_target_weight"
    assert "0..999" in violation.message


def test_aws_target_group_names_fit_in_32_characters() -> None:
    lb = demo_aws_lb()
    long_pool = replace(lb.pools[0], name="checkout-frontend-canary")  # + "demo-" and "-use1": 34 characters
    lb = replace(lb, pools=(long_pool, *lb.pools[1:]),
                 listeners=tuple(replace(ls, default_pool="api") for ls in lb.listeners), routes=())
    violations = check_limits(lb)
    assert _codes(violations) == ["aws_target_group_name", "aws_target_group_name"]  # one per region
    assert "'demo-checkout-frontend-canary-use1'" in violations[0].message
    assert "has 34" in violations[0].message


def test_aws_needs_every_pool_in_every_region_and_two_subnets() -> None:
    lb = demo_aws_lb()
    web = replace(lb.pools[0], regions=lb.pools[0].regions[:1])
    nets = (replace(lb.networks[0], subnet_ids=("subnet-1a",)), lb.networks[1])
    codes = _codes(check_limits(replace(lb, pools=(web, *lb.pools[1:]), networks=nets)))
    assert codes == ["aws_subnets", "aws_pool_not_in_region"]


def test_aws_health_checks_accept_2xx_to_4xx_and_5_to_300_seconds() -> None:
    lb = demo_aws_lb()
    bad = replace(lb.pools[0], health=lb.pools[0].health._replace(interval_s=2, expected_status=503))
    assert _codes(check_limits(replace(lb, pools=(bad, *lb.pools[1:])))) == [
        "aws_health_interval", "aws_health_status"]


# --- GCP ----------------------------------------------------------------------------------------------------

@pytest.mark.parametrize(("scaler", "ok"),
                         [(0.0, True), (0.05, False), (0.1, True), (1.0, True), (1.5, False)])
def test_gcp_capacity_scaler_is_0_or_a_tenth_to_one(scaler: float, ok: bool) -> None:
    lb = _with_pool_region(demo_gcp_lb(), "web", "us-central1", capacity_scaler=scaler)
    codes = _codes(check_limits(lb))
    if ok:
        assert codes == []
    else:
        assert "gcp_capacity_scaler" in codes


@pytest.mark.parametrize("rate", [None, 0.0, -1.0])
def test_gcp_rate_balancing_needs_a_positive_max_rate(rate: float | None) -> None:
    lb = _with_pool_region(demo_gcp_lb(), "api", "europe-west1", max_rate_per_member=rate)
    violations = check_limits(lb)
    assert "gcp_max_rate" in _codes(violations)
    assert "pool 'api' in europe-west1" in next(v for v in violations if v.code == "gcp_max_rate").message


def test_gcp_health_checks_only_accept_200() -> None:
    lb = demo_gcp_lb()
    pool = replace(lb.pools[0], health=lb.pools[0].health._replace(expected_status=204))
    (violation,) = check_limits(replace(lb, pools=(pool, *lb.pools[1:])))
    assert violation.code == "gcp_health_status"


@pytest.mark.parametrize(("weight", "ok"), [(1000, True), (1001, False)])
def test_gcp_weights_go_up_to_1000(weight: int, ok: bool) -> None:
    routes = (CloudRoute(1, (), "prefix", "/", (RouteTarget("web", weight), RouteTarget("api", 0))),)
    assert _codes(check_limits(demo_gcp_lb(routes=routes))) == ([] if ok else ["gcp_weight"])


def test_gcp_priority_zero_is_valid_unlike_aws() -> None:
    assert check_limits(demo_gcp_lb(routes=many_routes(1, first_priority=0))) == []


def test_gcp_allows_1000_route_rules_per_path_matcher() -> None:
    """Host-less routes land in every path matcher, so 1,001 of them overflow the '*' matcher."""
    hostless = tuple(CloudRoute(i, (), "exact", f"/p{i}", (RouteTarget("web", 1),)) for i in range(1001))
    assert check_limits(demo_gcp_lb(routes=hostless[:1000])) == []
    (violation,) = check_limits(demo_gcp_lb(routes=hostless))
    assert violation.code == "gcp_route_rules_per_matcher"
    assert "at most 1000 route rules per path matcher" in violation.message
    assert "sees 1001 routes" in violation.message


def test_gcp_allows_1000_host_rules_per_url_map() -> None:
    assert "gcp_host_rules" not in _codes(check_limits(demo_gcp_lb(routes=many_routes(1000))))
    (violation,) = check_limits(demo_gcp_lb(routes=many_routes(1001)))
    assert violation.code == "gcp_host_rules"
    assert "needs 1001" in violation.message


def test_gcp_refuses_a_url_map_over_1_mb() -> None:
    # 900 routes with 30 long host names each: 900 host rules (within the 1,000 limit) but ~1.5 MB.
    routes = tuple(CloudRoute(i + 1, tuple(f"{'x' * 40}-{i}-{j}.example.com" for j in range(30)), "prefix",
                              "/" + "p" * 200, (RouteTarget("web", 1),)) for i in range(900))
    lb = demo_gcp_lb(routes=routes)
    assert gcp_url_map_bytes(lb, lb.listeners[0]) > 1_000_000
    assert "gcp_url_map_size" in _codes(check_limits(lb))


def test_gcp_resource_names_fit_in_63_characters() -> None:
    lb = demo_gcp_lb()
    pool = replace(lb.pools[2], name="a" * 50)
    routes = (CloudRoute(1, (), "prefix", "/", (RouteTarget("a" * 50, 1),)),)
    codes = _codes(check_limits(replace(lb, pools=(*lb.pools[:2], pool), routes=routes)))
    assert set(codes) == {"gcp_resource_name"}


# --- both -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("path", ["/api }\nbind :1", "/api\n", "/a b", "api", "/x*", "/q?a=1", "/it's"])
def test_paths_that_would_mean_different_things_on_each_cloud_are_refused(path: str) -> None:
    route = CloudRoute(1, (), "prefix", path, (RouteTarget("web", 1),))
    for lb in (demo_gcp_lb(routes=(route,)), demo_aws_lb(routes=(route,))):
        assert _codes(check_limits(lb)) == ["invalid_path"], path


@pytest.mark.parametrize("host", ["*", "Example.com", "a..b", "bad host", "x.example.com\n", "*foo.com"])
def test_malformed_hosts_are_refused(host: str) -> None:
    route = CloudRoute(1, (host,), "prefix", "/", (RouteTarget("web", 1),))
    assert _codes(check_limits(demo_gcp_lb(routes=(route,)))) == ["invalid_host"]


def test_member_weights_must_be_equal_because_cloud_backends_have_none() -> None:
    lb = _with_pool_region(demo_gcp_lb(), "web", "us-central1",
                           members=(CloudMember("10.0.0.1", 80, 100), CloudMember("10.0.0.2", 80, 50),
                                    CloudMember("10.0.0.3", 80, 0)))
    (violation,) = check_limits(lb)
    assert violation.code == "member_weight_unsupported"
    assert "weighted 50, 100" in violation.message


def test_inconsistent_models_are_refused_with_one_message_each() -> None:
    lb = demo_gcp_lb()
    routes = (CloudRoute(5, (), "prefix", "/a", (RouteTarget("nope", 1),)),
              CloudRoute(5, (), "prefix", "/b", ()),
              CloudRoute(6, (), "prefix", "/c", (RouteTarget("web", 0),)))
    listeners = (*lb.listeners, replace(lb.listeners[0]),
                 replace(lb.listeners[1], port=8443, certificate_ref=None))
    extra_region = CloudPoolRegion("asia-east1", 10.0, 1.0, ())
    web = replace(lb.pools[0], regions=(*lb.pools[0].regions, extra_region))
    codes = _codes(check_limits(replace(lb, routes=routes, listeners=listeners, pools=(web, *lb.pools[1:]),
                                        networks=lb.networks[:1])))
    assert codes == ["network_missing", "unknown_region", "duplicate_port", "certificate_missing",
                     "unknown_pool", "duplicate_priority", "route_without_target", "route_weight_zero"]


def test_synthesize_refuses_before_loading_cdktf(tmp_path: Path) -> None:
    """Run in a fresh interpreter so 'cdktf was never imported' means something (this session may have)."""
    script = f"""
import json, sys
from deploy.synth import synthesize
from deploy.limits import LimitError
from tests.cloud.cloudkit import many_routes
from tests.cloud.cloudkit import demo_aws_lb
try:
    synthesize(demo_aws_lb(routes=many_routes(131)), {str(tmp_path / 'out')!r})
except LimitError as exc:
    print(json.dumps({{"codes": [v.code for v in exc.violations], "message": str(exc),
                      "loaded": sorted(m for m in sys.modules if m.split('.')[0] in ('cdktf', 'jsii'))}}))
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=True)
    result = json.loads(done.stdout)
    assert result["codes"] == ["aws_rules_per_alb"]
    assert "needs 262 (131 routes x 2 listeners)" in result["message"]
    assert result["loaded"] == []
    assert not (tmp_path / "out").exists()
