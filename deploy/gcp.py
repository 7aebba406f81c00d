"""GCP stack: a global external Application Load Balancer (Envoy-based, EXTERNAL_MANAGED) for one CloudLB.

Importing this module loads the prebuilt google provider into the jsii node process (seconds): only
`deploy.synth` imports it, once per process.

Shape (one of each per ..., names from deploy.mapping):
- google_compute_global_address (LB): the static IP; `address` is set when Spillway owns one (BYOIP).
- google_compute_health_check (pool): HTTP on the serving port.
- google_compute_network_endpoint_group (pool x region): zonal hybrid NEG, NON_GCP_PRIVATE_IP_PORT, because
  Spillway's members are addresses it does not manage as GCE instances; google_compute_network_endpoints
  lists the members with weight > 0 (NEG endpoints carry no weight).
- google_compute_backend_service (pool): one backend per region, balancing_mode RATE with the pool's
  max_rate_per_member as max_rate_per_endpoint (NEG backends take the per-endpoint rate, not
  max_rate_per_instance, which is for instance groups) and the region's capacity_scaler. GCP then fills
  the nearest region up to that rate and overflows to the next, as Spillway's HAProxy fleets do.
- google_compute_url_map (listener): host rules + path matchers from deploy.mapping.gcp_host_groups;
  routes become route_rules whose `priority` is the route priority (path_rules would be longest-match).
- google_compute_target_http(s)_proxy and google_compute_global_forwarding_rule (listener), the rule on
  the global address.
"""

from __future__ import annotations

import ipaddress

from cdktn import LocalBackend, TerraformOutput, TerraformStack
from cdktn_provider_google.compute_backend_service import (
    ComputeBackendService,
    ComputeBackendServiceBackend,
)
from cdktn_provider_google.compute_global_address import ComputeGlobalAddress
from cdktn_provider_google.compute_global_forwarding_rule import ComputeGlobalForwardingRule
from cdktn_provider_google.compute_health_check import (
    ComputeHealthCheck,
    ComputeHealthCheckHttpHealthCheck,
)
from cdktn_provider_google.compute_network_endpoint_group import ComputeNetworkEndpointGroup
from cdktn_provider_google.compute_network_endpoints import (
    ComputeNetworkEndpoints,
    ComputeNetworkEndpointsNetworkEndpoints,
)
from cdktn_provider_google.compute_target_http_proxy import ComputeTargetHttpProxy
from cdktn_provider_google.compute_target_https_proxy import ComputeTargetHttpsProxy
from cdktn_provider_google.compute_url_map import (
    ComputeUrlMap,
    ComputeUrlMapHostRule,
    ComputeUrlMapPathMatcher,
    ComputeUrlMapPathMatcherRouteRules,
    ComputeUrlMapPathMatcherRouteRulesMatchRules,
    ComputeUrlMapPathMatcherRouteRulesRouteAction,
    ComputeUrlMapPathMatcherRouteRulesRouteActionWeightedBackendServices,
)
from cdktn_provider_google.provider import GoogleProvider
from constructs import Construct

from deploy import mapping as m
from deploy.model import CloudLB, CloudListener, CloudPool, CloudRoute

SCHEME = "EXTERNAL_MANAGED"
HEALTH_TIMEOUT_S = 5
HEALTHY_THRESHOLD = 2
UNHEALTHY_THRESHOLD = 2


class GcpLoadBalancerStack(TerraformStack):
    def __init__(self, scope: Construct, lb: CloudLB) -> None:
        super().__init__(scope, lb.name)
        self.lb = lb
        # A relative path keeps the synthesized JSON independent of the worker's working directory;
        # apps/cloud decides where state really lives when it applies.
        LocalBackend(self, path="terraform.tfstate")
        GoogleProvider(self, "google", project=lb.project_or_account, region=lb.regions[0])

        is_v6 = lb.static_ip is not None and ipaddress.ip_address(lb.static_ip).version == 6
        self.address = ComputeGlobalAddress(
            self, "address", name=m.gcp_address_name(lb), address=lb.static_ip,
            address_type="EXTERNAL", ip_version="IPV6" if is_v6 else "IPV4")
        TerraformOutput(self, "ip_address", value=self.address.address)

        self.services = {pool.name: self._backend_service(pool) for pool in lb.pools}
        groups = m.gcp_host_groups(lb)
        for listener in lb.listeners:
            self._listener(listener, groups)

    def _backend_service(self, pool: CloudPool) -> ComputeBackendService:
        lb = self.lb
        health = ComputeHealthCheck(
            self, f"hc-{pool.name}", name=m.gcp_health_check_name(lb, pool.name),
            check_interval_sec=pool.health.interval_s,
            timeout_sec=min(HEALTH_TIMEOUT_S, pool.health.interval_s),
            healthy_threshold=HEALTHY_THRESHOLD, unhealthy_threshold=UNHEALTHY_THRESHOLD,
            http_health_check=ComputeHealthCheckHttpHealthCheck(
                request_path=pool.health.path, port_specification="USE_SERVING_PORT"))
        backends = []
        for pr in pool.regions:
            net = lb.network(pr.region)
            assert net is not None and net.zone  # check_limits refused the LB otherwise
            neg = ComputeNetworkEndpointGroup(
                self, f"neg-{pool.name}-{pr.region}", name=m.gcp_neg_name(lb, pool.name, pr.region),
                network=net.network, zone=net.zone, network_endpoint_type="NON_GCP_PRIVATE_IP_PORT")
            active = [member for member in pr.members if member.weight > 0]
            if active:
                endpoints = [ComputeNetworkEndpointsNetworkEndpoints(ip_address=a.address, port=a.port)
                             for a in active]
                ComputeNetworkEndpoints(
                    self, f"endpoints-{pool.name}-{pr.region}", network_endpoint_group=neg.name,
                    zone=net.zone, network_endpoints=endpoints)
            backends.append(ComputeBackendServiceBackend(
                group=neg.id, balancing_mode="RATE", max_rate_per_endpoint=pr.max_rate_per_member,
                capacity_scaler=pr.capacity_scaler))
        return ComputeBackendService(
            self, f"bs-{pool.name}", name=m.gcp_backend_service_name(lb, pool.name), protocol="HTTP",
            load_balancing_scheme=SCHEME, health_checks=[health.id], backend=backends)

    def _route_rule(self, route: CloudRoute) -> ComputeUrlMapPathMatcherRouteRules:
        if route.path_match == "prefix":
            match = ComputeUrlMapPathMatcherRouteRulesMatchRules(prefix_match=route.path)
        else:
            match = ComputeUrlMapPathMatcherRouteRulesMatchRules(full_path_match=route.path)
        if len(route.targets) == 1:
            return ComputeUrlMapPathMatcherRouteRules(
                priority=route.priority, match_rules=[match], service=self.services[route.targets[0].pool].id)
        weighted = [ComputeUrlMapPathMatcherRouteRulesRouteActionWeightedBackendServices(
            backend_service=self.services[t.pool].id, weight=t.weight) for t in route.targets]
        return ComputeUrlMapPathMatcherRouteRules(
            priority=route.priority, match_rules=[match],
            route_action=ComputeUrlMapPathMatcherRouteRulesRouteAction(weighted_backend_services=weighted))

    def _listener(self, listener: CloudListener, groups: list[m.HostGroup]) -> None:
        lb, port = self.lb, listener.port
        default = self.services[listener.default_pool].id
        url_map = ComputeUrlMap(
            self, f"urlmap-{port}", name=m.gcp_url_map_name(lb, port), default_service=default,
            host_rule=[ComputeUrlMapHostRule(hosts=list(g.hosts), path_matcher=g.matcher) for g in groups],
            path_matcher=[ComputeUrlMapPathMatcher(
                name=g.matcher, default_service=default,
                route_rules=[self._route_rule(r) for r in g.routes]) for g in groups])
        proxy: ComputeTargetHttpProxy | ComputeTargetHttpsProxy
        if listener.protocol == "https":
            proxy = ComputeTargetHttpsProxy(
                self, f"proxy-{port}", name=m.gcp_proxy_name(lb, port), url_map=url_map.id,
                ssl_certificates=[listener.certificate_ref or ""])
        else:
            proxy = ComputeTargetHttpProxy(
                self, f"proxy-{port}", name=m.gcp_proxy_name(lb, port), url_map=url_map.id)
        ComputeGlobalForwardingRule(
            self, f"fr-{port}", name=m.gcp_forwarding_rule_name(lb, port), target=proxy.id,
            ip_address=self.address.id, ip_protocol="TCP", port_range=str(port), load_balancing_scheme=SCHEME)
