"""Write a `deploy.model.CloudLB` into the database (LB, listeners, static IP, pools, regions, members, routes)
and a CloudTarget for it, so tests can check that the selector reads back exactly the model it was given."""

from __future__ import annotations

from dataclasses import replace

from apps.balancers.models import (
    IpPool,
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Region,
    Route,
    RouteTarget,
    StaticIP,
)
from apps.cloud.models import CloudTarget
from deploy.model import CloudLB


def build_db_lb(org, model: CloudLB, *, credentials_ref: str = "", target_name: str | None = None,
                lb_name: str | None = None) -> tuple[LoadBalancer, CloudTarget]:
    target = CloudTarget.objects.create(
        org=org, name=target_name or f"{model.provider}-target", provider=model.provider,
        project_or_account=model.project_or_account, regions=list(model.regions), credentials_ref=credentials_ref,
        networks={n.region: {"network": n.network, "zone": n.zone, "subnet_ids": list(n.subnet_ids),
                             "security_group_ids": list(n.security_group_ids)} for n in model.networks},
        certificate_refs={f"{ls.protocol}-{ls.port}": ls.certificate_ref
                          for ls in model.listeners if ls.certificate_ref})
    lb = LoadBalancer.objects.create(org=org, name=lb_name or model.name, kind=model.provider,
                                     cloud_target=target)
    regions = {slug: Region.objects.get_or_create(slug=slug, defaults={"name": slug})[0]
               for slug in {*model.regions, *(pr.region for p in model.pools for pr in p.regions)}}
    pools = {}
    for cp in model.pools:
        pool = Pool.objects.create(lb=lb, org=org, name=cp.name, health_path=cp.health.path,
                                   health_interval_s=cp.health.interval_s,
                                   health_expected_status=cp.health.expected_status)
        pools[cp.name] = pool
        for pr in cp.regions:
            PoolRegion.objects.create(pool=pool, region=regions[pr.region], max_rate_per_member=pr.max_rate_per_member,
                                      capacity_scaler=pr.capacity_scaler)
            for i, m in enumerate(pr.members):
                # Weight 0 in the cloud model is a drained member in Spillway's.
                Member.objects.create(
                    pool=pool, region=regions[pr.region], name=f"{pr.region}-{i}", address=m.address, port=m.port,
                    weight=m.weight or 100,
                    admin_state=Member.AdminState.ACTIVE if m.weight else Member.AdminState.DRAIN)
    static_ip = None
    if model.static_ip:
        ip_pool = IpPool.objects.create(name=f"{lb.name}-ips", cidr=f"{model.static_ip}/32", provider=model.provider)
        static_ip = StaticIP.objects.create(pool=ip_pool, address=model.static_ip, org=org)
    for ls in model.listeners:
        Listener.objects.create(lb=lb, name=f"{ls.protocol}-{ls.port}", protocol=ls.protocol, port=ls.port,
                                static_ip=static_ip, default_pool=pools.get(ls.default_pool))
    for cr in model.routes:
        route = Route.objects.create(lb=lb, org=org, hosts=list(cr.hosts), path_match=cr.path_match, path=cr.path,
                                     priority=cr.priority)
        for t in cr.targets:
            RouteTarget.objects.create(route=route, pool=pools[t.pool], weight=t.weight)
    return lb, target


def normalized(model: CloudLB) -> CloudLB:
    """Order-free form: the database has no order for pools, regions or members beyond their names."""
    pools = tuple(sorted(
        (replace(p, regions=tuple(sorted(
            (replace(pr, members=tuple(sorted(pr.members))) for pr in p.regions), key=lambda r: r.region)))
         for p in model.pools), key=lambda p: p.name))
    routes = tuple(sorted((replace(r, targets=tuple(sorted(r.targets))) for r in model.routes),
                          key=lambda r: r.priority))
    return replace(model, pools=pools, routes=routes,
                   listeners=tuple(sorted(model.listeners, key=lambda ls: ls.port)),
                   networks=tuple(sorted(model.networks, key=lambda n: n.region)))
