"""The AWS Terraform JSON says, field by field, what the Spillway model says.

No AWS API is reachable here: the synthesized JSON is the product of this layer. Every route is looked up
on every listener of every regional ALB, every pool region in its target group.
"""

from __future__ import annotations

from typing import Any

import pytest

from deploy.model import CloudLB
from tests.cloud.cloudkit import ROUTES, demo_aws_lb, deref, resources

REGIONS = ("us-east-1", "eu-west-1")
SHORT = {"us-east-1": "use1", "eu-west-1": "euw1"}


@pytest.fixture(scope="module")
def doc(cdktf_worker, tmp_path_factory) -> dict[str, Any]:
    return cdktf_worker(demo_aws_lb(), tmp_path_factory.mktemp("aws"))


def _tg_name(doc: dict[str, Any], ref: str) -> str:
    kind, body, attr = deref(doc, ref)
    assert (kind, attr) == ("aws_lb_target_group", "arn")
    return body["name"]


def _listeners_by_region_port(doc: dict[str, Any]) -> dict[tuple[str, int], tuple[str, dict[str, Any]]]:
    found = {}
    for key, body in doc["resource"]["aws_lb_listener"].items():
        found[(body["region"], body["port"])] = (key, body)
    return found


def test_the_provider_is_pinned_to_the_models_account(doc) -> None:
    assert doc["provider"]["aws"] == [{"allowed_account_ids": ["123456789012"], "region": "us-east-1"}]
    assert doc["terraform"]["backend"] == {"local": {"path": "terraform.tfstate"}}


def test_the_static_ip_belongs_to_the_global_accelerator(doc) -> None:
    accelerators = resources(doc, "aws_globalaccelerator_accelerator")
    assert list(accelerators) == ["demo"]
    accelerator = accelerators["demo"]
    assert accelerator["ip_addresses"] == ["198.51.100.7"]
    assert accelerator["ip_address_type"] == "IPV4"
    assert accelerator["enabled"] is True
    # No other resource claims the address.
    for kind, bodies in doc["resource"].items():
        if kind != "aws_globalaccelerator_accelerator":
            assert "198.51.100.7" not in str(bodies), kind


def test_each_listener_port_reaches_every_regional_alb_through_the_accelerator(doc) -> None:
    lb = demo_aws_lb()
    ga_listeners = doc["resource"]["aws_globalaccelerator_listener"]
    ports = {}
    for key, body in ga_listeners.items():
        assert deref(doc, body["accelerator_arn"])[1]["name"] == "demo"
        assert body["protocol"] == "TCP"
        (port_range,) = body["port_range"]
        assert port_range["from_port"] == port_range["to_port"]
        ports[key] = port_range["from_port"]
    assert sorted(ports.values()) == [80, 443]

    groups = doc["resource"]["aws_globalaccelerator_endpoint_group"].values()
    seen = set()
    for group in groups:
        port = ports[group["listener_arn"][2:-1].split(".")[1]]
        region = group["endpoint_group_region"]
        (endpoint,) = group["endpoint_configuration"]
        kind, alb, attr = deref(doc, endpoint["endpoint_id"])
        assert (kind, attr) == ("aws_lb", "arn")
        assert (alb["region"], alb["name"]) == (region, f"demo-{SHORT[region]}")
        assert endpoint["client_ip_preservation_enabled"] is True
        # A region's traffic dial follows its largest capacity_scaler (eu-west-1: web 0.5, api 0, canary 0.1).
        scalers = [pr.capacity_scaler for p in lb.pools if (pr := p.region(region))]
        assert group["traffic_dial_percentage"] == 100 * max(scalers)
        seen.add((port, region))
    assert seen == {(p, r) for p in (80, 443) for r in REGIONS}
    eu = [g for g in groups if g["endpoint_group_region"] == "eu-west-1"]
    assert {g["traffic_dial_percentage"] for g in eu} == {50}


def test_one_alb_per_region_in_the_models_subnets(doc) -> None:
    lb = demo_aws_lb()
    albs = resources(doc, "aws_lb")
    assert set(albs) == {"demo-use1", "demo-euw1"}
    for region in REGIONS:
        alb = albs[f"demo-{SHORT[region]}"]
        net = lb.network(region)
        assert alb["region"] == region
        assert alb["load_balancer_type"] == "application"
        assert alb["internal"] is False
        assert alb["subnets"] == list(net.subnet_ids)
        assert alb.get("security_groups", []) == list(net.security_group_ids)


def test_each_pool_region_is_an_ip_target_group_with_its_health_check_and_capacity(doc) -> None:
    lb = demo_aws_lb()
    groups = resources(doc, "aws_lb_target_group")
    attachments = doc["resource"]["aws_lb_target_group_attachment"].values()
    assert len(groups) == len(lb.pools) * len(REGIONS)
    for pool in lb.pools:
        for pr in pool.regions:
            group = groups[f"demo-{pool.name}-{SHORT[pr.region]}"]
            assert group["region"] == pr.region
            assert group["vpc_id"] == lb.network(pr.region).network
            assert (group["target_type"], group["protocol"]) == ("ip", "HTTP")
            health = group["health_check"]
            assert health["path"] == pool.health.path
            assert health["interval"] == pool.health.interval_s
            assert health["matcher"] == str(pool.health.expected_status)
            assert health["timeout"] < health["interval"]
            assert health["port"] == "traffic-port"
            assert group["tags"]["spillway:capacity_scaler"] == f"{pr.capacity_scaler:g}"
            assert group["tags"]["spillway:max_rate_per_member"] == f"{pr.max_rate_per_member:g}"
            attached = sorted((a["target_id"], a["port"]) for a in attachments
                              if _tg_name(doc, a["target_group_arn"]) == group["name"])
            assert all(a["region"] == pr.region for a in attachments
                       if _tg_name(doc, a["target_group_arn"]) == group["name"])
            assert attached == sorted((m.address, m.port) for m in pr.members if m.weight > 0)
    assert groups["demo-api-use1"]["health_check"]["matcher"] == "204"
    assert "10.0.0.3" not in {a["target_id"] for a in attachments}  # drained member


def test_listeners_default_to_their_pool_in_their_own_region(doc) -> None:
    listeners = _listeners_by_region_port(doc)
    assert set(listeners) == {(r, p) for r in REGIONS for p in (80, 443)}
    for region in REGIONS:
        _, http = listeners[(region, 80)]
        _, https = listeners[(region, 443)]
        assert http["protocol"] == "HTTP" and "certificate_arn" not in http
        assert https["protocol"] == "HTTPS"
        assert https["certificate_arn"] == "arn:aws:acm:us-east-1:123456789012:certificate/demo"
        for listener, pool in ((http, "web"), (https, "api")):
            (action,) = listener["default_action"]
            assert action["type"] == "forward"
            assert _tg_name(doc, action["target_group_arn"]) == f"demo-{pool}-{SHORT[region]}"
            assert deref(doc, listener["load_balancer_arn"])[1]["name"] == f"demo-{SHORT[region]}"


@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("port", [80, 443])
def test_every_route_is_a_rule_with_its_priority_conditions_and_weights(doc, region: str, port: int) -> None:
    listener_key, _ = _listeners_by_region_port(doc)[(region, port)]
    rules = {body["priority"]: body for body in doc["resource"]["aws_lb_listener_rule"].values()
             if body["listener_arn"] == f"${{aws_lb_listener.{listener_key}.arn}}"}
    assert sorted(rules) == sorted(r.priority for r in ROUTES)
    for route in ROUTES:
        rule = rules[route.priority]
        assert rule["region"] == region
        conditions = {next(iter(c)): next(iter(c.values()))["values"] for c in rule["condition"]}
        expected = {"path_pattern": [route.path + "*" if route.path_match == "prefix" else route.path]}
        if route.hosts:
            expected["host_header"] = list(route.hosts)
        assert conditions == expected
        (action,) = rule["action"]
        assert action["type"] == "forward"
        if len(route.targets) == 1:
            pool = route.targets[0].pool
            assert _tg_name(doc, action["target_group_arn"]) == f"demo-{pool}-{SHORT[region]}"
        else:
            got = [(_tg_name(doc, t["arn"]), t["weight"]) for t in action["forward"]["target_group"]]
            assert got == [(f"demo-{t.pool}-{SHORT[region]}", t.weight) for t in route.targets]


def test_spot_values_from_the_demo(doc) -> None:
    """The same facts as above, typed out by hand, in case the model and the JSON were read wrong alike."""
    rules = [b for b in doc["resource"]["aws_lb_listener_rule"].values() if b["region"] == "eu-west-1"]
    canary = [r for r in rules if r["priority"] == 10]
    assert len(canary) == 2  # ports 80 and 443
    assert canary[0]["condition"] == [{"host_header": {"values": ["api.example.com"]}},
                                      {"path_pattern": {"values": ["/v1*"]}}]
    assert [t["weight"] for t in canary[0]["action"][0]["forward"]["target_group"]] == [90, 10]
    status = next(r for r in rules if r["priority"] == 20)
    assert status["condition"][1] == {"path_pattern": {"values": ["/status"]}}
    static = next(r for r in rules if r["priority"] == 40)
    assert static["condition"] == [{"path_pattern": {"values": ["/static*"]}}]


def test_no_static_ip_lets_aws_assign_the_accelerator_addresses(cdktf_worker, tmp_path) -> None:
    lb: CloudLB = demo_aws_lb(static_ip=None)
    doc = cdktf_worker(lb, tmp_path)
    assert "ip_addresses" not in resources(doc, "aws_globalaccelerator_accelerator")["demo"]
    assert doc["output"]["dns_name"]["value"].startswith("${aws_globalaccelerator_accelerator.")
