"""Read a gcp/aws LoadBalancer and its cloud target from the database into a `deploy.model.CloudLB`.

The synthesis layer sees only `CloudLB`; everything Spillway-specific (drained members, static IP rows,
per-listener certificates kept on the target) is resolved here.
"""

from __future__ import annotations

from typing import Any

from apps.balancers.models import Listener, LoadBalancer, Member, Pool, Route
from apps.cloud.models import CloudTarget
from apps.cloud.regions import provider_region
from deploy.model import (
    CloudLB,
    CloudListener,
    CloudMember,
    CloudPool,
    CloudPoolRegion,
    CloudRegionNetwork,
    CloudRoute,
    HealthCheck,
    RouteTarget,
)


def cloud_lb(lb: LoadBalancer, target: CloudTarget) -> CloudLB:
    """The cloud model of `lb` as it would be applied on `target` (no validation: see deploy.limits)."""
    # Providers see their own region names only (target.region_map; refused at save when incomplete).
    region_map: dict[str, str] = target.region_map or {}
    pools = list(Pool.objects.filter(lb=lb).prefetch_related("regions__region").order_by("name"))
    members_by_pool: dict[tuple[int, int], list[CloudMember]] = {}
    for member in Member.objects.filter(pool__lb=lb).order_by("pool_id", "name"):
        # A member drained or in maintenance must take no new traffic: weight 0 leaves it out of the backend.
        weight = member.weight if member.admin_state == Member.AdminState.ACTIVE else 0
        members_by_pool.setdefault((member.pool_id, member.region_id), []).append(
            CloudMember(member.address, member.port, weight))
    cloud_pools = tuple(
        CloudPool(
            name=pool.name,
            health=HealthCheck(pool.health_path or "/", pool.health_interval_s, pool.health_expected_status),
            regions=tuple(
                CloudPoolRegion(
                    region=provider_region(region_map, pr.region.slug),
                    max_rate_per_member=pr.max_rate_per_member,
                    capacity_scaler=pr.capacity_scaler,
                    members=tuple(members_by_pool.get((pool.pk, pr.region_id), ())),
                )
                for pr in sorted(pool.regions.all(), key=lambda r: r.region.slug)
            ),
        )
        for pool in pools
    )
    listeners = list(Listener.objects.filter(lb=lb).select_related("static_ip", "default_pool").order_by("port"))
    cert_refs: dict[str, Any] = target.certificate_refs or {}
    cloud_listeners = tuple(
        CloudListener(
            protocol=listener.protocol,  # type: ignore[arg-type]  # checked by deploy.limits
            port=listener.port,
            default_pool=listener.default_pool.name if listener.default_pool else "",
            certificate_ref=cert_refs.get(listener.name) or cert_refs.get(str(listener.port)) or None,
        )
        for listener in listeners
    )
    # One anycast address fronts every listener of a cloud LB; the first listener holding one gives it.
    static_ip = next((ls.static_ip.address for ls in listeners if ls.static_ip is not None), None)
    routes = tuple(
        CloudRoute(
            priority=route.priority,
            hosts=tuple(route.hosts or ()),
            path_match=route.path_match,  # type: ignore[arg-type]
            path=route.path,
            targets=tuple(RouteTarget(t.pool.name, t.weight)
                          for t in sorted(route.targets.all(), key=lambda t: t.pool.name)),
        )
        for route in Route.objects.filter(lb=lb).prefetch_related("targets__pool").order_by("priority")
    )
    return CloudLB(
        name=lb.name,
        provider=target.provider,  # type: ignore[arg-type]
        project_or_account=target.project_or_account,
        regions=tuple(provider_region(region_map, r) for r in target.regions or ()),
        static_ip=static_ip,
        listeners=cloud_listeners,
        pools=cloud_pools,
        routes=routes,
        networks=_networks(target),
    )


def _networks(target: CloudTarget) -> tuple[CloudRegionNetwork, ...]:
    found = []
    for region in target.regions or ():
        net = (target.networks or {}).get(region)
        if not isinstance(net, dict) or not net.get("network"):
            continue  # deploy.limits names the region that lacks network settings
        found.append(CloudRegionNetwork(
            region=provider_region(target.region_map or {}, region),
            network=str(net["network"]),
            zone=net.get("zone") or None,
            subnet_ids=tuple(net.get("subnet_ids") or ()),
            security_group_ids=tuple(net.get("security_group_ids") or ()),
        ))
    return tuple(found)
