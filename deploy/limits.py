"""Provider limits and well-formedness checks, run before any synthesis (pure: no cdktf import).

Typed cdktf classes catch a wrong keyword or type, but not a value the cloud API will refuse at apply time
(a sixth condition value, a weight of 1000 on AWS, a capacity_scaler of 0.05 on GCP). Those would surface
minutes later as a failed `terraform apply`; here they are refused up front with a sentence naming the limit.

Sources (default values; "quota" ones can be raised per account/project, then pass `aws_rules_per_alb`):
- AWS: Elastic Load Balancing, "Quotas for your Application Load Balancers" (rules per ALB 100 excluding
  default rules; condition values per rule 5; target groups per action 5; target groups per ALB 100;
  targets per ALB 1,000; listeners per ALB 50) and the ELBv2 API reference (rule priority 1-50,000,
  target group weight 0-999, target group and load balancer names at most 32 characters, condition value at
  most 128 characters, health check interval 5-300 s, matcher codes 200-499).
- GCP: Cloud Load Balancing "Quotas and limits", URL maps section, external Application Load Balancer
  column (host rules and path matchers per URL map 1,000; path rules or route rules per path matcher 1,000;
  hosts per host rule 1,000; predicates per path matcher 1,000; distinct backend services per URL map 2,500;
  endpoints per hybrid NEG 10,000), "URL map size and quota units" (1 MB per URL map for the Envoy-based
  global external Application Load Balancer this layer creates), and the Compute API reference
  (capacityScaler 0 or 0.1-1.0; route rule priority 0-2,147,483,647; weightedBackendServices weight
  0-1,000; health check interval 1-300 s; resource names RFC 1035, at most 63 characters).

Choice: a route whose hosts + path exceed AWS's 5 condition values per rule is refused, not split into
several rules. Splitting would spend rules from the 100-rule quota and invent priorities that may collide
with the user's own; the message tells the user how to split it themselves.
"""

from __future__ import annotations

import ipaddress
import json
from collections.abc import Iterator
from dataclasses import dataclass

from deploy.mapping import (
    ANY_HOST,
    HOST_RE,
    PATH_RE,
    SLUG_RE,
    HostGroup,
    aws_alb_name,
    aws_path_pattern,
    aws_target_group_name,
    gcp_backend_service_name,
    gcp_host_groups,
    gcp_resource_names,
    gcp_url_map_name,
)
from deploy.model import CloudLB, CloudListener, CloudMember, CloudPool, CloudRoute

AWS_RULES_PER_ALB = 100
AWS_RULE_PRIORITY_MAX = 50_000
AWS_CONDITION_VALUES_PER_RULE = 5
AWS_CONDITION_VALUE_CHARS = 128
AWS_TARGET_GROUPS_PER_ACTION = 5
AWS_TARGET_GROUP_WEIGHT_MAX = 999
AWS_TARGET_GROUPS_PER_ALB = 100
AWS_TARGETS_PER_ALB = 1_000
AWS_LISTENERS_PER_ALB = 50
AWS_NAME_CHARS = 32
AWS_HEALTH_INTERVAL_S = (5, 300)
AWS_HEALTH_STATUS = (200, 499)

GCP_HOST_RULES_PER_URL_MAP = 1_000
GCP_PATH_MATCHERS_PER_URL_MAP = 1_000
GCP_ROUTE_RULES_PER_PATH_MATCHER = 1_000
GCP_HOSTS_PER_HOST_RULE = 1_000
GCP_PREDICATES_PER_PATH_MATCHER = 1_000
GCP_BACKEND_SERVICES_PER_URL_MAP = 2_500
GCP_URL_MAP_BYTES = 1_000_000
GCP_ENDPOINTS_PER_HYBRID_NEG = 10_000
GCP_RULE_PRIORITY_MAX = 2_147_483_647
GCP_WEIGHT_MAX = 1_000
GCP_NAME_CHARS = 63
GCP_HEALTH_INTERVAL_S = (1, 300)
GCP_CAPACITY_SCALER_MIN = 0.1


@dataclass(frozen=True)
class LimitViolation:
    code: str
    limit: float | None  # the numeric limit broken, None for a malformed value
    message: str


class LimitError(ValueError):
    """Raised by `synthesize` when `check_limits` finds anything; nothing was synthesized."""

    def __init__(self, violations: list[LimitViolation]) -> None:
        self.violations = violations
        super().__init__("; ".join(v.message for v in violations))


def check_limits(lb: CloudLB, *, aws_rules_per_alb: int = AWS_RULES_PER_ALB) -> list[LimitViolation]:
    """Every reason the provider would refuse `lb` (or Spillway could not express it), in a stable order."""
    found = list(_check_common(lb))
    if lb.provider == "aws":
        found += _check_aws(lb, aws_rules_per_alb)
    elif lb.provider == "gcp":
        found += _check_gcp(lb)
    else:
        found.append(_bad("invalid_provider", f"Unknown provider {lb.provider!r}; use gcp or aws."))
    return found


# --- checks both providers need -------------------------------------------------------------------------

def _check_common(lb: CloudLB) -> Iterator[LimitViolation]:
    if not SLUG_RE.fullmatch(lb.name):
        yield _bad("invalid_name", f"Load balancer name {lb.name!r} {SLUG_RULE}.")
    if not lb.regions:
        yield _bad("region_missing", f"Load balancer {lb.name!r} lists no region.")
    if lb.static_ip is not None and not _is_ip(lb.static_ip):
        yield _bad("invalid_address", f"Static IP {lb.static_ip!r} is not an IP address.")
    needs = "VPC and zone" if lb.provider == "gcp" else "VPC and subnets"
    for region in lb.regions:
        if lb.network(region) is None:
            yield _bad("network_missing", f"Region {region} has no network settings ({needs}).")
    yield from _check_pools(lb)
    yield from _check_listeners(lb)
    yield from _check_routes(lb)


def _check_pools(lb: CloudLB) -> Iterator[LimitViolation]:
    seen: set[str] = set()
    for pool in lb.pools:
        if pool.name in seen:
            yield _bad("duplicate_pool", f"Pool name {pool.name!r} is used twice.")
        seen.add(pool.name)
        if not SLUG_RE.fullmatch(pool.name):
            yield _bad("invalid_name", f"Pool name {pool.name!r} {SLUG_RULE}.")
        if not PATH_RE.fullmatch(pool.health.path):
            yield _bad("invalid_path",
                       f"Health check path {pool.health.path!r} of pool {pool.name!r} {PATH_RULE}.")
        for pr in pool.regions:
            where = f"pool {pool.name!r} in {pr.region}"
            if pr.region not in lb.regions:
                yield _bad("unknown_region", f"Region {pr.region} of pool {pool.name!r} is not one of the "
                           f"load balancer's regions ({', '.join(lb.regions)}).")
            if not 0 <= pr.capacity_scaler <= 1:
                yield LimitViolation(
                    "capacity_scaler_range", 1.0,
                    f"capacity_scaler of {where} is {pr.capacity_scaler}; it must be 0..1.")
            if pr.max_rate_per_member is not None and pr.max_rate_per_member < 0:
                yield _bad("max_rate_invalid", f"max_rate_per_member of {where} is negative.")
            yield from _check_members(where, pr.members)


def _check_members(where: str, members: tuple[CloudMember, ...]) -> Iterator[LimitViolation]:
    for member in members:
        endpoint = f"{member.address}:{member.port} of {where}"
        if not _is_ip(member.address):
            yield _bad("invalid_address", f"Member {endpoint}: the address is not an IP address.")
        if not 1 <= member.port <= 65535:
            yield LimitViolation("invalid_port", 65535, f"Member {endpoint}: the port is not 1..65535.")
        if member.weight < 0:
            yield _bad("invalid_weight", f"Member {endpoint} has a negative weight.")
    # Neither GCP NEG endpoints nor AWS ALB targets carry a weight: different weights would be lost silently.
    weights = sorted({m.weight for m in members if m.weight > 0})
    if len(weights) > 1:
        yield _bad(
            "member_weight_unsupported",
            f"Cloud load balancers give every member the same share, but {where} has members weighted "
            f"{', '.join(map(str, weights))}. Use equal weights (0 drains a member), or put the members in "
            "separate pools and weight the route targets instead.")


def _check_listeners(lb: CloudLB) -> Iterator[LimitViolation]:
    if not lb.listeners:
        yield _bad("listener_missing", f"Load balancer {lb.name!r} has no listener.")
    ports: set[int] = set()
    certificate = "an ACM certificate ARN" if lb.provider == "aws" else "a GCP SSL certificate"
    for listener in lb.listeners:
        port = listener.port
        if port in ports:
            yield _bad("duplicate_port", f"Two listeners use port {port}.")
        ports.add(port)
        if not 1 <= port <= 65535:
            yield LimitViolation("invalid_port", 65535, f"Listener port {port} is not 1..65535.")
        if listener.protocol not in ("http", "https"):
            yield _bad("invalid_protocol", f"Listener on port {port} uses {listener.protocol!r}; cloud "
                       "Application Load Balancers take http or https.")
        if listener.protocol == "https" and not listener.certificate_ref:
            yield _bad("certificate_missing", f"The https listener on port {port} needs {certificate}.")
        if lb.pool(listener.default_pool) is None:
            yield _bad("unknown_pool", f"Listener on port {port} defaults to pool {listener.default_pool!r}, "
                       "which this load balancer does not have.")


def _check_routes(lb: CloudLB) -> Iterator[LimitViolation]:
    priorities: set[int] = set()
    for route in lb.routes:
        name = _route_name(route)
        if route.priority in priorities:
            yield _bad("duplicate_priority",
                       f"Two routes have priority {route.priority}; priorities are unique per load balancer.")
        priorities.add(route.priority)
        for host in route.hosts:
            if host == ANY_HOST or not HOST_RE.fullmatch(host):
                yield _bad("invalid_host", f"{name}: host {host!r} is not a lowercase hostname or a '*.' "
                           "wildcard (leave hosts empty to match every host).")
        if route.path_match not in ("prefix", "exact"):
            yield _bad("invalid_path_match",
                       f"{name}: path match {route.path_match!r} is not prefix or exact.")
        if not PATH_RE.fullmatch(route.path):
            yield _bad("invalid_path", f"{name}: the path {PATH_RULE}.")
        yield from _check_targets(lb, route, name)


def _check_targets(lb: CloudLB, route: CloudRoute, name: str) -> Iterator[LimitViolation]:
    if not route.targets:
        yield _bad("route_without_target", f"{name} has no target pool.")
    elif all(t.weight == 0 for t in route.targets):
        yield _bad("route_weight_zero", f"{name}: every target has weight 0, so it could serve nothing.")
    pools = [t.pool for t in route.targets]
    if len(set(pools)) != len(pools):
        yield _bad("duplicate_target", f"{name} names the same pool twice; merge the weights.")
    for target in route.targets:
        if lb.pool(target.pool) is None:
            yield _bad("unknown_pool",
                       f"{name} targets pool {target.pool!r}, which this load balancer does not have.")
        if target.weight < 0:
            yield _bad("invalid_weight", f"{name}: target {target.pool!r} has a negative weight.")


# --- AWS ----------------------------------------------------------------------------------------------------

def _check_aws(lb: CloudLB, rules_per_alb: int) -> Iterator[LimitViolation]:
    rules = len(lb.routes) * len(lb.listeners)
    if rules > rules_per_alb:
        yield LimitViolation(
            "aws_rules_per_alb", rules_per_alb,
            f"AWS ALB allows at most {rules_per_alb} rules per load balancer (quota 'Rules per Application "
            f"Load Balancer', default {AWS_RULES_PER_ALB}; raise it with AWS first); this load balancer "
            f"needs {rules} ({len(lb.routes)} routes x {len(lb.listeners)} listeners).")
    if len(lb.listeners) > AWS_LISTENERS_PER_ALB:
        yield LimitViolation(
            "aws_listeners_per_alb", AWS_LISTENERS_PER_ALB,
            f"AWS ALB allows at most {AWS_LISTENERS_PER_ALB} listeners; this load balancer has "
            f"{len(lb.listeners)}.")
    if lb.static_ip is not None and _is_ip(lb.static_ip) and ipaddress.ip_address(lb.static_ip).version == 6:
        yield _bad("aws_static_ip", f"Static IP {lb.static_ip} is IPv6; Global Accelerator brings your own "
                   "IPv4 addresses only.")
    yield from _check_aws_names(lb)
    yield from _check_aws_regions(lb)
    for route in lb.routes:
        yield from _check_aws_route(route)
    for pool in lb.pools:
        yield from _check_aws_health(pool)


def _check_aws_names(lb: CloudLB) -> Iterator[LimitViolation]:
    for region in lb.regions:
        name = aws_alb_name(lb, region)
        if len(name) > AWS_NAME_CHARS:
            yield LimitViolation(
                "aws_alb_name", AWS_NAME_CHARS,
                f"AWS allows at most {AWS_NAME_CHARS} characters in a load balancer name; {name!r} (load "
                f"balancer + region) has {len(name)}. Shorten the load balancer name.")
        for pool in lb.pools:
            name = aws_target_group_name(lb, pool.name, region)
            if len(name) > AWS_NAME_CHARS:
                yield LimitViolation(
                    "aws_target_group_name", AWS_NAME_CHARS,
                    f"AWS allows at most {AWS_NAME_CHARS} characters in a target group name; {name!r} (load "
                    f"balancer + pool + region) has {len(name)}. Shorten the load balancer or pool name.")


def _check_aws_regions(lb: CloudLB) -> Iterator[LimitViolation]:
    for region in lb.regions:
        net = lb.network(region)
        if net is not None and len(net.subnet_ids) < 2:
            yield LimitViolation(
                "aws_subnets", 2,
                f"An AWS ALB needs subnets in at least two availability zones; {region} lists "
                f"{len(net.subnet_ids)}.")
        if len(lb.pools) > AWS_TARGET_GROUPS_PER_ALB:
            yield LimitViolation(
                "aws_target_groups_per_alb", AWS_TARGET_GROUPS_PER_ALB,
                f"AWS ALB allows at most {AWS_TARGET_GROUPS_PER_ALB} target groups; the ALB in {region} "
                f"needs {len(lb.pools)} (one per pool).")
        targets = 0
        for pool in lb.pools:
            pr = pool.region(region)
            if pr is None:
                yield _bad("aws_pool_not_in_region",
                           f"AWS ALBs are regional: pool {pool.name!r} has no entry for {region}, where this "
                           "load balancer has an ALB. Add the region to the pool (members may be empty).")
                continue
            targets += sum(1 for m in pr.members if m.weight > 0)
        if targets > AWS_TARGETS_PER_ALB:
            yield LimitViolation(
                "aws_targets_per_alb", AWS_TARGETS_PER_ALB,
                f"AWS ALB allows at most {AWS_TARGETS_PER_ALB} targets; the ALB in {region} needs {targets}.")


def _check_aws_route(route: CloudRoute) -> Iterator[LimitViolation]:
    name = _route_name(route)
    if not 1 <= route.priority <= AWS_RULE_PRIORITY_MAX:
        yield LimitViolation(
            "aws_rule_priority", AWS_RULE_PRIORITY_MAX,
            f"AWS ALB rule priorities are 1..{AWS_RULE_PRIORITY_MAX}; {name} has {route.priority}.")
    values = len(route.hosts) + 1
    if values > AWS_CONDITION_VALUES_PER_RULE:
        yield LimitViolation(
            "aws_condition_values", AWS_CONDITION_VALUES_PER_RULE,
            f"AWS ALB allows at most {AWS_CONDITION_VALUES_PER_RULE} condition values per rule (hosts + "
            f"path); {name} needs {values} ({len(route.hosts)} hosts + 1 path). Split it into routes of at "
            f"most {AWS_CONDITION_VALUES_PER_RULE - 1} hosts each.")
    for value in (*route.hosts, aws_path_pattern(route)):
        if len(value) > AWS_CONDITION_VALUE_CHARS:
            yield LimitViolation(
                "aws_condition_value_length", AWS_CONDITION_VALUE_CHARS,
                f"AWS ALB condition values are at most {AWS_CONDITION_VALUE_CHARS} characters; {name} has "
                f"one of {len(value)}.")
    if len(route.targets) > AWS_TARGET_GROUPS_PER_ACTION:
        yield LimitViolation(
            "aws_targets_per_action", AWS_TARGET_GROUPS_PER_ACTION,
            f"AWS ALB forwards to at most {AWS_TARGET_GROUPS_PER_ACTION} weighted target groups per rule; "
            f"{name} has {len(route.targets)}.")
    for target in route.targets:
        if target.weight > AWS_TARGET_GROUP_WEIGHT_MAX:
            yield LimitViolation(
                "aws_target_weight", AWS_TARGET_GROUP_WEIGHT_MAX,
                f"AWS ALB target group weights are 0..{AWS_TARGET_GROUP_WEIGHT_MAX}; {name} gives pool "
                f"{target.pool!r} {target.weight}.")


def _check_aws_health(pool: CloudPool) -> Iterator[LimitViolation]:
    low, high = AWS_HEALTH_INTERVAL_S
    if not low <= pool.health.interval_s <= high:
        yield LimitViolation(
            "aws_health_interval", high,
            f"AWS health check intervals are {low}..{high} s; pool {pool.name!r} asks for "
            f"{pool.health.interval_s} s.")
    low, high = AWS_HEALTH_STATUS
    if not low <= pool.health.expected_status <= high:
        yield LimitViolation(
            "aws_health_status", high,
            f"AWS health checks accept status codes {low}..{high}; pool {pool.name!r} expects "
            f"{pool.health.expected_status}.")


# --- GCP ----------------------------------------------------------------------------------------------------

def _check_gcp(lb: CloudLB) -> Iterator[LimitViolation]:
    for name in gcp_resource_names(lb):
        if len(name) > GCP_NAME_CHARS:
            yield LimitViolation(
                "gcp_resource_name", GCP_NAME_CHARS,
                f"GCP resource names are at most {GCP_NAME_CHARS} characters; {name!r} has {len(name)}. "
                "Shorten the load balancer or pool name.")
    for region in lb.regions:
        net = lb.network(region)
        if net is not None and not net.zone:
            yield _bad("gcp_zone_missing",
                       f"Region {region} needs a zone for its hybrid network endpoint groups.")
    for pool in lb.pools:
        yield from _check_gcp_pool(pool)
    for route in lb.routes:
        name = _route_name(route)
        if not 0 <= route.priority <= GCP_RULE_PRIORITY_MAX:
            yield LimitViolation(
                "gcp_rule_priority", GCP_RULE_PRIORITY_MAX,
                f"GCP route rule priorities are 0..{GCP_RULE_PRIORITY_MAX}; {name} has {route.priority}.")
        for target in route.targets:
            if target.weight > GCP_WEIGHT_MAX:
                yield LimitViolation(
                    "gcp_weight", GCP_WEIGHT_MAX,
                    f"GCP weighted backend services take weights 0..{GCP_WEIGHT_MAX}; {name} gives pool "
                    f"{target.pool!r} {target.weight}.")
    yield from _check_gcp_url_map(lb)


def _check_gcp_pool(pool: CloudPool) -> Iterator[LimitViolation]:
    low, high = GCP_HEALTH_INTERVAL_S
    if not low <= pool.health.interval_s <= high:
        yield LimitViolation(
            "gcp_health_interval", high,
            f"GCP health check intervals are {low}..{high} s; pool {pool.name!r} asks for "
            f"{pool.health.interval_s} s.")
    if pool.health.expected_status != 200:
        yield LimitViolation(
            "gcp_health_status", 200,
            f"GCP HTTP health checks only accept status 200; pool {pool.name!r} expects "
            f"{pool.health.expected_status}.")
    for pr in pool.regions:
        where = f"pool {pool.name!r} in {pr.region}"
        scaler = pr.capacity_scaler
        if scaler != 0 and not GCP_CAPACITY_SCALER_MIN <= scaler <= 1:
            yield LimitViolation(
                "gcp_capacity_scaler", GCP_CAPACITY_SCALER_MIN,
                f"GCP capacity_scaler must be 0 or {GCP_CAPACITY_SCALER_MIN}..1.0; {where} has {scaler}.")
        if pr.max_rate_per_member is None or pr.max_rate_per_member <= 0:
            yield LimitViolation(
                "gcp_max_rate", 0,
                f"GCP RATE balancing needs max_rate_per_member > 0 for every backend; {where} has "
                f"{pr.max_rate_per_member}.")
        endpoints = sum(1 for m in pr.members if m.weight > 0)
        if endpoints > GCP_ENDPOINTS_PER_HYBRID_NEG:
            yield LimitViolation(
                "gcp_endpoints_per_neg", GCP_ENDPOINTS_PER_HYBRID_NEG,
                f"GCP hybrid NEGs hold at most {GCP_ENDPOINTS_PER_HYBRID_NEG} endpoints; {where} has "
                f"{endpoints}.")


def _check_gcp_url_map(lb: CloudLB) -> Iterator[LimitViolation]:
    groups = gcp_host_groups(lb)
    if len(groups) > GCP_HOST_RULES_PER_URL_MAP:
        yield LimitViolation(
            "gcp_host_rules", GCP_HOST_RULES_PER_URL_MAP,
            f"GCP URL maps allow at most {GCP_HOST_RULES_PER_URL_MAP} host rules and path matchers; this "
            f"load balancer needs {len(groups)} (one per set of hosts that share the same routes).")
    for group in groups:
        if len(group.hosts) > GCP_HOSTS_PER_HOST_RULE:
            yield LimitViolation(
                "gcp_hosts_per_host_rule", GCP_HOSTS_PER_HOST_RULE,
                f"GCP allows at most {GCP_HOSTS_PER_HOST_RULE} hosts per host rule; {group.hosts[0]} and the "
                f"hosts sharing its routes are {len(group.hosts)}.")
        # One prefixMatch or fullPathMatch per route rule, so predicates equal route rules here.
        if len(group.routes) > GCP_ROUTE_RULES_PER_PATH_MATCHER:
            yield LimitViolation(
                "gcp_route_rules_per_matcher", GCP_ROUTE_RULES_PER_PATH_MATCHER,
                f"GCP allows at most {GCP_ROUTE_RULES_PER_PATH_MATCHER} route rules per path matcher; host "
                f"{group.hosts[0]} sees {len(group.routes)} routes (its own, the wildcard routes covering "
                "it and the routes with no host).")
    services = {t.pool for r in lb.routes for t in r.targets} | {ls.default_pool for ls in lb.listeners}
    if len(services) > GCP_BACKEND_SERVICES_PER_URL_MAP:
        yield LimitViolation(
            "gcp_backend_services_per_url_map", GCP_BACKEND_SERVICES_PER_URL_MAP,
            f"A GCP URL map can reference at most {GCP_BACKEND_SERVICES_PER_URL_MAP} backend services; "
            f"this one references {len(services)}.")
    size = max((gcp_url_map_bytes(lb, listener, groups) for listener in lb.listeners), default=0)
    if size > GCP_URL_MAP_BYTES:
        yield LimitViolation(
            "gcp_url_map_size", GCP_URL_MAP_BYTES,
            f"A GCP URL map is at most {GCP_URL_MAP_BYTES // 1000} KB; this one would be about "
            f"{size // 1000} KB. Use fewer hosts per route or fewer routes.")


def gcp_url_map_bytes(lb: CloudLB, listener: CloudListener, groups: list[HostGroup] | None = None) -> int:
    """Estimated size of the URL map as the Compute API stores it (compact JSON with full service URLs).

    GCP does not publish its exact accounting; this counts the same structure the stack creates and errs
    high (a full https URL for every backend service reference, weighted form for every route).
    """
    groups = gcp_host_groups(lb) if groups is None else groups
    prefix = f"https://www.googleapis.com/compute/v1/projects/{lb.project_or_account}/global/backendServices/"

    def service(pool: str) -> str:
        return prefix + gcp_backend_service_name(lb, pool)

    def rule(route: CloudRoute) -> dict[str, object]:
        match = {"prefixMatch" if route.path_match == "prefix" else "fullPathMatch": route.path}
        action = {"weightedBackendServices": [{"backendService": service(t.pool), "weight": t.weight}
                                              for t in route.targets]}
        return {"priority": route.priority, "matchRules": [match], "routeAction": action}

    default = service(listener.default_pool)
    body = {
        "name": gcp_url_map_name(lb, listener.port),
        "defaultService": default,
        "hostRules": [{"hosts": list(g.hosts), "pathMatcher": g.matcher} for g in groups],
        "pathMatchers": [
            {"name": g.matcher, "defaultService": default, "routeRules": [rule(r) for r in g.routes]}
            for g in groups],
    }
    return len(json.dumps(body, separators=(",", ":")))


# --- helpers ----------------------------------------------------------------------------------------------

SLUG_RULE = "must be lowercase letters, digits and hyphens, starting with a letter"
PATH_RULE = "must start with / and use only letters, digits and _ . $ / ~ @ : + -"


def _bad(code: str, message: str) -> LimitViolation:
    return LimitViolation(code, None, message)


def _route_name(route: CloudRoute) -> str:
    hosts = ",".join(route.hosts) or "any host"
    return f"Route priority {route.priority} ({hosts} {route.path})"


def _is_ip(address: str) -> bool:
    try:
        ipaddress.ip_address(address)
    except ValueError:
        return False
    return True
