"""AWS stack: one Application Load Balancer per region behind one Global Accelerator, for one CloudLB.

Importing this module loads the prebuilt aws provider into the jsii node process (seconds): only
`deploy.synth` imports it, once per process.

Why this shape:
- An ALB is regional and has no static IP, while a Spillway LB spans regions and may own a static IP.
  Global Accelerator gives one anycast entry point with static IPv4 addresses (`ip_addresses` takes the
  Spillway static IP when it is a BYOIP address; without one AWS assigns two) and sends each client to
  the nearest healthy regional ALB. NLB Elastic IPs were the alternative, but they are per region and
  an NLB cannot do host/path routing.
- One provider (aws provider 6.x): every regional resource sets its own `region` argument.
- Per region: aws_lb, one aws_lb_target_group per pool (target_type ip, the members with weight > 0
  attached with aws_lb_target_group_attachment: ALB targets carry no weight), one aws_lb_listener per
  CloudListener defaulting to the default pool, and one aws_lb_listener_rule per route and listener
  (host-header + path-pattern conditions, route priority, forward to one target group or a weighted
  forward to several).
- Members are registered by IP without an availability zone, which AWS accepts for addresses inside the
  ALB's VPC; members reached over peering, VPN or Direct Connect would need availability_zone "all",
  which the model cannot tell apart yet.
- Capacity: ALBs have no rate-based balancing mode, so max_rate_per_member cannot be enforced by AWS.
  Each target group carries it, and capacity_scaler, as tags; the accelerator endpoint group of a region
  gets traffic_dial_percentage = 100 x the largest capacity_scaler of any pool there, so a region drained
  in every pool (scaler 0) receives no new traffic. Per-pool differences within a region are not
  expressible on AWS.
"""

from __future__ import annotations

from cdktn import LocalBackend, TerraformOutput, TerraformStack
from cdktn_provider_aws.globalaccelerator_accelerator import GlobalacceleratorAccelerator
from cdktn_provider_aws.globalaccelerator_endpoint_group import (
    GlobalacceleratorEndpointGroup,
    GlobalacceleratorEndpointGroupEndpointConfiguration,
)
from cdktn_provider_aws.globalaccelerator_listener import (
    GlobalacceleratorListener,
    GlobalacceleratorListenerPortRange,
)
from cdktn_provider_aws.lb import Lb
from cdktn_provider_aws.lb_listener import LbListener, LbListenerDefaultAction
from cdktn_provider_aws.lb_listener_rule import (
    LbListenerRule,
    LbListenerRuleAction,
    LbListenerRuleActionForward,
    LbListenerRuleActionForwardTargetGroup,
    LbListenerRuleCondition,
    LbListenerRuleConditionHostHeader,
    LbListenerRuleConditionPathPattern,
)
from cdktn_provider_aws.lb_target_group import LbTargetGroup, LbTargetGroupHealthCheck
from cdktn_provider_aws.lb_target_group_attachment import LbTargetGroupAttachment
from cdktn_provider_aws.provider import AwsProvider
from constructs import Construct

from deploy import mapping as m
from deploy.model import CloudLB, CloudListener, CloudPool, CloudRoute

HEALTH_TIMEOUT_S = 5
HEALTHY_THRESHOLD = 2
UNHEALTHY_THRESHOLD = 2
DEFAULT_TARGET_PORT = 80
ENDPOINT_WEIGHT = 128  # Global Accelerator's default; only relative weights within a region matter


class AwsLoadBalancerStack(TerraformStack):
    def __init__(self, scope: Construct, lb: CloudLB) -> None:
        super().__init__(scope, lb.name)
        self.lb = lb
        LocalBackend(self, path="terraform.tfstate")
        # allowed_account_ids makes terraform refuse to touch any other account than the one in the model.
        AwsProvider(self, "aws", region=lb.regions[0], allowed_account_ids=[lb.project_or_account])

        self.accelerator = GlobalacceleratorAccelerator(
            self, "accelerator", name=lb.name, ip_address_type="IPV4", enabled=True,
            ip_addresses=[lb.static_ip] if lb.static_ip else None)
        TerraformOutput(self, "dns_name", value=self.accelerator.dns_name)

        albs = {region: self._region(region) for region in lb.regions}
        for listener in lb.listeners:
            ga_listener = GlobalacceleratorListener(
                self, f"ga-listener-{listener.port}", accelerator_arn=self.accelerator.id, protocol="TCP",
                client_affinity="NONE",
                port_range=[GlobalacceleratorListenerPortRange(from_port=listener.port,
                                                               to_port=listener.port)])
            for region, alb in albs.items():
                GlobalacceleratorEndpointGroup(
                    self, f"ga-endpoints-{listener.port}-{region}", listener_arn=ga_listener.id,
                    endpoint_group_region=region, traffic_dial_percentage=self._traffic_dial(region),
                    endpoint_configuration=[GlobalacceleratorEndpointGroupEndpointConfiguration(
                        endpoint_id=alb.arn, client_ip_preservation_enabled=True, weight=ENDPOINT_WEIGHT)])

    def _traffic_dial(self, region: str) -> float:
        scalers = [pr.capacity_scaler for pool in self.lb.pools if (pr := pool.region(region)) is not None]
        return round(100 * max(scalers, default=1.0), 1)

    def _region(self, region: str) -> Lb:
        lb = self.lb
        net = lb.network(region)
        assert net is not None  # check_limits refused the LB otherwise
        alb = Lb(self, f"alb-{region}", name=m.aws_alb_name(lb, region), region=region,
                 load_balancer_type="application", internal=False, ip_address_type="ipv4",
                 subnets=list(net.subnet_ids), security_groups=list(net.security_group_ids) or None,
                 tags={"spillway:lb": lb.name})
        groups = {pool.name: self._target_group(pool, region, net.network) for pool in lb.pools}
        for listener in lb.listeners:
            self._listener(listener, region, alb, groups)
        return alb

    def _target_group(self, pool: CloudPool, region: str, vpc_id: str) -> LbTargetGroup:
        lb = self.lb
        pr = pool.region(region)
        assert pr is not None
        active = [member for member in pr.members if member.weight > 0]
        interval = pool.health.interval_s
        max_rate = "" if pr.max_rate_per_member is None else f"{pr.max_rate_per_member:g}"
        group = LbTargetGroup(
            self, f"tg-{pool.name}-{region}", name=m.aws_target_group_name(lb, pool.name, region),
            region=region, target_type="ip", protocol="HTTP", vpc_id=vpc_id,
            port=active[0].port if active else DEFAULT_TARGET_PORT,
            health_check=LbTargetGroupHealthCheck(
                enabled=True, protocol="HTTP", port="traffic-port", path=pool.health.path, interval=interval,
                # AWS requires the timeout to be shorter than the interval.
                timeout=min(HEALTH_TIMEOUT_S, interval - 1), matcher=str(pool.health.expected_status),
                healthy_threshold=HEALTHY_THRESHOLD, unhealthy_threshold=UNHEALTHY_THRESHOLD),
            tags={"spillway:lb": lb.name, "spillway:pool": pool.name,
                  "spillway:max_rate_per_member": max_rate,
                  "spillway:capacity_scaler": f"{pr.capacity_scaler:g}"})
        for i, member in enumerate(active):
            LbTargetGroupAttachment(
                self, f"tg-{pool.name}-{region}-member-{i}", target_group_arn=group.arn,
                target_id=member.address, port=member.port, region=region)
        return group

    def _listener(self, listener: CloudListener, region: str, alb: Lb,
                  groups: dict[str, LbTargetGroup]) -> None:
        https = listener.protocol == "https"
        aws_listener = LbListener(
            self, f"listener-{listener.port}-{region}", load_balancer_arn=alb.arn, region=region,
            port=listener.port, protocol="HTTPS" if https else "HTTP",
            certificate_arn=listener.certificate_ref if https else None,
            default_action=[LbListenerDefaultAction(type="forward",
                                                    target_group_arn=groups[listener.default_pool].arn)])
        for route in self.lb.routes_in_order():
            LbListenerRule(
                self, f"rule-{listener.port}-{region}-{route.priority}", listener_arn=aws_listener.arn,
                region=region, priority=route.priority, condition=self._conditions(route),
                action=[self._action(route, groups)])

    @staticmethod
    def _conditions(route: CloudRoute) -> list[LbListenerRuleCondition]:
        conditions = []
        if route.hosts:
            conditions.append(LbListenerRuleCondition(
                host_header=LbListenerRuleConditionHostHeader(values=list(route.hosts))))
        conditions.append(LbListenerRuleCondition(
            path_pattern=LbListenerRuleConditionPathPattern(values=[m.aws_path_pattern(route)])))
        return conditions

    @staticmethod
    def _action(route: CloudRoute, groups: dict[str, LbTargetGroup]) -> LbListenerRuleAction:
        if len(route.targets) == 1:
            return LbListenerRuleAction(type="forward", target_group_arn=groups[route.targets[0].pool].arn)
        return LbListenerRuleAction(type="forward", forward=LbListenerRuleActionForward(
            target_group=[LbListenerRuleActionForwardTargetGroup(arn=groups[t.pool].arn, weight=t.weight)
                          for t in route.targets]))
