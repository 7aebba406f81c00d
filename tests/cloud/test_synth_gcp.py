"""The GCP Terraform JSON says, field by field, what the Spillway model says.

cdktf's typed classes catch a wrong keyword, but not a wrong value inside a block, so every route,
pool region and listener of the demo load balancer is looked up in the synthesized JSON. No GCP API is
reachable here: the JSON is the product of this layer, and `terraform plan` against GCP is out of scope.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from deploy.mapping import gcp_host_groups, host_covers
from deploy.model import CloudRoute, RouteTarget
from tests.cloud.cloudkit import ROUTES, demo_gcp_lb, deref, resources


@pytest.fixture(scope="module")
def synthesized(cdktf_worker, tmp_path_factory) -> tuple[dict[str, Any], Path]:
    outdir = tmp_path_factory.mktemp("gcp")
    return cdktf_worker(demo_gcp_lb(), outdir), outdir


@pytest.fixture(scope="module")
def doc(synthesized) -> dict[str, Any]:
    return synthesized[0]


def _name(doc: dict[str, Any], ref: str) -> str:
    return deref(doc, ref)[1]["name"]


def test_the_json_written_to_outdir_is_the_json_returned(synthesized) -> None:
    doc, outdir = synthesized
    written = json.loads((outdir / "stacks" / "demo" / "cdk.tf.json").read_text())
    assert written == doc
    assert doc["provider"]["google"] == [{"project": "spillway-demo", "region": "us-central1"}]
    # A relative state path: the JSON does not depend on the worker's working directory.
    assert doc["terraform"]["backend"] == {"local": {"path": "terraform.tfstate"}}


def test_the_static_ip_is_the_global_address_every_forwarding_rule_uses(doc) -> None:
    address = resources(doc, "google_compute_global_address")["demo-ip"]
    assert address["address"] == "203.0.113.10"
    assert address["address_type"] == "EXTERNAL"
    assert address["ip_version"] == "IPV4"
    rules = resources(doc, "google_compute_global_forwarding_rule")
    assert set(rules) == {"demo-80-fr", "demo-443-fr"}
    for rule in rules.values():
        assert _name(doc, rule["ip_address"]) == "demo-ip"
        assert rule["load_balancing_scheme"] == "EXTERNAL_MANAGED"
        assert rule["ip_protocol"] == "TCP"
    assert doc["output"]["ip_address"]["value"].startswith("${google_compute_global_address.")


def test_each_listener_gets_its_proxy_url_map_and_port(doc) -> None:
    rules = resources(doc, "google_compute_global_forwarding_rule")
    http_kind, http_proxy, _ = deref(doc, rules["demo-80-fr"]["target"])
    https_kind, https_proxy, _ = deref(doc, rules["demo-443-fr"]["target"])
    assert rules["demo-80-fr"]["port_range"] == "80"
    assert rules["demo-443-fr"]["port_range"] == "443"
    assert (http_kind, http_proxy["name"]) == ("google_compute_target_http_proxy", "demo-80-proxy")
    assert (https_kind, https_proxy["name"]) == ("google_compute_target_https_proxy", "demo-443-proxy")
    assert https_proxy["ssl_certificates"] == ["projects/spillway-demo/global/sslCertificates/demo"]
    assert _name(doc, http_proxy["url_map"]) == "demo-80"
    assert _name(doc, https_proxy["url_map"]) == "demo-443"


def test_every_pool_has_an_http_health_check_on_the_serving_port(doc) -> None:
    checks = resources(doc, "google_compute_health_check")
    expected = {"demo-web-hc": ("/healthz", 5), "demo-api-hc": ("/ready", 10),
                "demo-api-canary-hc": ("/ready", 10)}
    assert set(checks) == set(expected)
    for name, (path, interval_s) in expected.items():
        check = checks[name]
        assert check["http_health_check"] == {"request_path": path, "port_specification": "USE_SERVING_PORT"}
        assert check["check_interval_sec"] == interval_s
        assert check["timeout_sec"] <= interval_s


def test_each_pool_region_is_a_hybrid_neg_holding_the_active_members(doc) -> None:
    lb = demo_gcp_lb()
    negs = resources(doc, "google_compute_network_endpoint_group")
    endpoint_sets = {_name(doc, "${google_compute_network_endpoint_group." + _key(doc, body) + ".id}"): body
                     for body in doc["resource"]["google_compute_network_endpoints"].values()}
    for pool in lb.pools:
        for pr in pool.regions:
            neg = negs[f"demo-{pool.name}-{pr.region}"]
            net = lb.network(pr.region)
            assert neg["network_endpoint_type"] == "NON_GCP_PRIVATE_IP_PORT"
            assert (neg["network"], neg["zone"]) == (net.network, net.zone)
            active = [{"ip_address": m.address, "port": m.port} for m in pr.members if m.weight > 0]
            if active:
                endpoints = endpoint_sets[neg["name"]]
                assert endpoints["zone"] == net.zone
                assert endpoints["network_endpoints"] == active
            else:
                assert neg["name"] not in endpoint_sets
    # The drained member (weight 0) of web in us-central1 is not an endpoint.
    web_us = endpoint_sets["demo-web-us-central1"]["network_endpoints"]
    assert {"ip_address": "10.0.0.3", "port": 8080} not in web_us


def _key(doc: dict[str, Any], endpoints: dict[str, Any]) -> str:
    # network_endpoint_group holds "${google_compute_network_endpoint_group.<key>.name}"
    return endpoints["network_endpoint_group"][2:-1].split(".")[1]


def test_each_backend_service_has_one_rate_backend_per_region_with_its_capacity(doc) -> None:
    lb = demo_gcp_lb()
    services = resources(doc, "google_compute_backend_service")
    assert set(services) == {"demo-web", "demo-api", "demo-api-canary"}
    for pool in lb.pools:
        service = services[f"demo-{pool.name}"]
        assert service["load_balancing_scheme"] == "EXTERNAL_MANAGED"
        assert service["protocol"] == "HTTP"
        assert [_name(doc, ref) for ref in service["health_checks"]] == [f"demo-{pool.name}-hc"]
        by_neg = {_name(doc, b["group"]): b for b in service["backend"]}
        assert set(by_neg) == {f"demo-{pool.name}-{pr.region}" for pr in pool.regions}
        for pr in pool.regions:
            backend = by_neg[f"demo-{pool.name}-{pr.region}"]
            assert backend["balancing_mode"] == "RATE"
            assert backend["max_rate_per_endpoint"] == pr.max_rate_per_member
            assert backend["capacity_scaler"] == pr.capacity_scaler
    # Spot values straight from the demo, in case the model and the JSON were both read wrong the same way.
    api = {_name(doc, b["group"]): b for b in services["demo-api"]["backend"]}
    assert api["demo-api-europe-west1"]["capacity_scaler"] == 0
    assert api["demo-api-us-central1"]["max_rate_per_endpoint"] == 300


@pytest.mark.parametrize("port", [80, 443])
def test_url_map_routes_every_host_by_priority(doc, port: int) -> None:
    url_map = resources(doc, "google_compute_url_map")[f"demo-{port}"]
    default = "demo-web"
    assert _name(doc, url_map["default_service"]) == default
    matchers = {m["name"]: m for m in url_map["path_matcher"]}
    host_to_matcher = {h: rule["path_matcher"] for rule in url_map["host_rule"] for h in rule["hosts"]}
    # Each host is in exactly one host rule, every host rule points at an existing matcher.
    assert sum(len(rule["hosts"]) for rule in url_map["host_rule"]) == len(host_to_matcher)
    assert set(host_to_matcher.values()) == set(matchers)

    all_hosts = {h for r in ROUTES for h in r.hosts} | {"*"}
    assert set(host_to_matcher) == all_hosts
    for host, matcher_name in host_to_matcher.items():
        matcher = matchers[matcher_name]
        assert _name(doc, matcher["default_service"]) == default
        expected = sorted((r for r in ROUTES if _route_applies(r, host)), key=lambda r: r.priority)
        rules = matcher["route_rules"]
        assert [rule["priority"] for rule in rules] == [r.priority for r in expected], host
        for rule, route in zip(rules, expected, strict=True):
            key = "prefix_match" if route.path_match == "prefix" else "full_path_match"
            assert rule["match_rules"] == [{key: route.path}]
            assert _targets(doc, rule) == [(f"demo-{t.pool}", t.weight) for t in route.targets]


def _route_applies(route: CloudRoute, host: str) -> bool:
    if host == "*":
        return not route.hosts
    return not route.hosts or any(host_covers(pattern, host) for pattern in route.hosts)


def _targets(doc: dict[str, Any], rule: dict[str, Any]) -> list[tuple[str, int]]:
    if "service" in rule:
        assert "route_action" not in rule
        # A single target is a plain service: its weight cannot matter, the model's weight is echoed back.
        route = next(r for r in ROUTES if r.priority == rule["priority"])
        return [(_name(doc, rule["service"]), route.targets[0].weight)]
    return [(_name(doc, w["backend_service"]), w["weight"])
            for w in rule["route_action"]["weighted_backend_services"]]


def test_the_canary_split_is_a_weighted_backend_service_pair(doc) -> None:
    url_map = resources(doc, "google_compute_url_map")["demo-80"]
    rules = [rule for m in url_map["path_matcher"] for rule in m["route_rules"] if rule["priority"] == 10]
    assert len(rules) == 1  # only api.example.com carries it
    weighted = rules[0]["route_action"]["weighted_backend_services"]
    assert [(_name(doc, w["backend_service"]), w["weight"]) for w in weighted] == [
        ("demo-api", 90), ("demo-api-canary", 10)]


def test_a_wildcard_route_with_a_better_priority_is_not_shadowed_by_an_exact_host() -> None:
    """GIVEN *.example.com /status (priority 20) and www.example.com /cart (priority 30)
    WHEN GCP picks the host rule for www.example.com (exact beats wildcard)
    THEN that host's matcher still holds the wildcard route, ahead of its own (as AWS and HAProxy would)."""
    groups = {h: g for g in gcp_host_groups(demo_gcp_lb()) for h in g.hosts}
    assert [r.priority for r in groups["www.example.com"].routes] == [20, 30, 40]
    assert [r.priority for r in groups["*.example.com"].routes] == [20, 40]
    assert [r.priority for r in groups["*"].routes] == [40]
    # Hosts that see the same routes share one host rule, which keeps the URL map small.
    assert groups["www.example.com"] is groups["shop.example.com"]


def test_changing_a_weight_changes_only_that_weight(cdktf_worker, tmp_path) -> None:
    routes = (CloudRoute(10, ("api.example.com",), "prefix", "/v1",
                         (RouteTarget("api", 50), RouteTarget("api-canary", 50))), *ROUTES[1:])
    doc = cdktf_worker(demo_gcp_lb(routes=routes), tmp_path)
    url_map = resources(doc, "google_compute_url_map")["demo-80"]
    rule = next(r for m in url_map["path_matcher"] for r in m["route_rules"] if r["priority"] == 10)
    assert [w["weight"] for w in rule["route_action"]["weighted_backend_services"]] == [50, 50]


def test_an_lb_without_a_static_ip_still_reserves_one_address(cdktf_worker, tmp_path) -> None:
    doc = cdktf_worker(demo_gcp_lb(static_ip=None), tmp_path)
    address = resources(doc, "google_compute_global_address")["demo-ip"]
    assert "address" not in address  # GCP picks it; the output reports it
