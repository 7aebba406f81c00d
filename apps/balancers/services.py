"""Writes for the balancers domain. Each change writes its audit event and bumps the LB revision."""

from __future__ import annotations

import datetime as dt
import ipaddress
from collections.abc import Iterable
from typing import Any

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from apps.accounts.principal import Principal
from apps.audit.services import AuditAction, audit_record, audit_snapshot, audited_delete, audited_save
from apps.balancers import hostnames, queries
from apps.balancers.models import (
    HostnameClaim,
    IpPool,
    Listener,
    LoadBalancer,
    Member,
    Pool,
    PoolRegion,
    Route,
    RouteChange,
    RouteTarget,
    StaticIP,
)
from apps.balancers.route_rules import check_peers, check_route, claims_related, early_peers
from apps.balancers.signals import lb_changed, member_runtime_changed
from apps.core import netpolicy, produced, quotas, vrrp
from apps.core.errors import Conflict, DomainError
from apps.core.locks import xact_lock
from apps.core.prepared import PreparedQuery

# Every route write takes its LB's row lock first (route_save): compiled once (apps.core.prepared).
_LB_LOCKED = PreparedQuery(
    lambda lb_id: LoadBalancer.objects.select_for_update().filter(pk=lb_id).values_list("revision", flat=True),
    {"lb_id": (1, 2)})


def lb_touch(lb_id: int, *, route_ids: Iterable[int] = ()) -> None:
    """Bump the LB's revision and tell listeners (fleets, cloud) once the transaction commits.

    `route_ids`: the change touched only these routes (created, updated or deleted). It is journaled
    (RouteChange) with the revision, so a fleet can apply it without reading every route again; the
    signal says `routes_only` so fleets know no full read is due. Without it, the change is anything else.
    """
    # One round trip (RETURNING: PostgreSQL, SQLite >= 3.35): the ORM's update() returns no rows. The LB's row
    # stays locked from here to the commit, so every route write of the LB waits through this.
    ids, now = sorted(set(route_ids)), timezone.now()
    bump = f"UPDATE {LoadBalancer._meta.db_table} SET revision = revision + 1, updated_at = %s WHERE id = %s"  # noqa: S608
    with connection.cursor() as cursor:
        if ids and connection.vendor == "postgresql":
            # The journal rows in the same statement: one round trip less under that lock.
            cursor.execute(
                f"WITH bumped AS ({bump} RETURNING revision) INSERT INTO {RouteChange._meta.db_table} "  # noqa: S608
                "(lb_id, lb_revision, route_id, created_at) SELECT %s, bumped.revision, route_id, %s "
                "FROM bumped, unnest(%s::bigint[]) AS route_id RETURNING lb_revision",
                [now, lb_id, lb_id, now, ids])
            revision = cursor.fetchone()[0]
        else:
            cursor.execute(f"{bump} RETURNING revision", [now, lb_id])
            revision = cursor.fetchone()[0]
            if ids:
                RouteChange.objects.bulk_create([RouteChange(lb_id=lb_id, lb_revision=revision, route_id=pk)
                                                 for pk in ids])
    produced.record(lb_id, revision)  # for the request's answer (apps.core.produced)
    transaction.on_commit(lambda: lb_changed.send(sender=LoadBalancer, lb_id=lb_id, revision=revision,
                                                  routes_only=bool(ids)))


ROUTE_CHANGES_KEEP = dt.timedelta(hours=1)


def route_changes_prune() -> int:
    """Drop journal rows older than an hour: a reconciler whose memory is older reads every route again."""
    deleted, _ = RouteChange.objects.filter(created_at__lt=timezone.now() - ROUTE_CHANGES_KEEP).delete()
    return deleted


def _lb_of(obj) -> int | None:
    if isinstance(obj, LoadBalancer):
        return None  # the LB's own metadata (name, shared) does not change what nodes serve
    if isinstance(obj, Listener | Pool | Route):
        return obj.lb_id
    if isinstance(obj, PoolRegion | Member):
        return obj.pool.lb_id
    return None


def object_save(*, principal: Principal | None, obj, action: AuditAction | str | None = None,
                data: dict[str, Any] | None = None):
    """Create or update one balancers object (audited) and bump its LB's revision.

    For plain objects whose rules the serializer and database constraints already enforce; objects
    with cross-row rules have their own service below.
    """
    def bump(saved) -> None:
        lb_id = _lb_of(saved)
        if lb_id is not None:
            lb_touch(lb_id)

    quota = getattr(type(obj), "QUOTA", None)  # a model an org may hold only so many of (apps.core.quotas)
    if quota and obj.pk is None:
        org = (data or {}).get("org") or getattr(obj, "org", None)
        if org is not None:
            quotas.check_count(org, quota)
    return audited_save(principal=principal, obj=obj, action=action, data=data, after_save=bump)


def object_delete(*, principal: Principal | None, obj) -> None:
    lb_id = _lb_of(obj)
    route_ids = [obj.pk] if isinstance(obj, Route) else []
    if route_ids:
        quotas.check_write_rate(obj.org, "route_changes_per_minute")
    audited_delete(principal=principal, obj=obj,
                   after_delete=(lambda: lb_touch(lb_id, route_ids=route_ids)) if lb_id is not None else None)


# --- pools ------------------------------------------------------------------------


def pool_create(*, principal: Principal | None, data: dict[str, Any]) -> Pool:
    """A pool and its per-region capacity rows in one transaction (each audited): all or nothing.

    `data["regions"]` is a list of {region, max_rate_per_member?, capacity_scaler?}; a region named twice
    is refused by the database's unique (pool, region) as a 409 with nothing created.
    """
    data = dict(data)
    regions = data.pop("regions", None) or []
    with transaction.atomic():
        pool = object_save(principal=principal, obj=Pool(), action="create", data=data)
        for row in regions:
            object_save(principal=principal, obj=PoolRegion(pool=pool), action="create", data=row)
    return pool


# --- members ---------------------------------------------------------------------


def member_create(*, principal: Principal | None, data: dict[str, Any]) -> Member:
    """A member, and its pool's capacity row for the member's region on first use (both audited)."""
    with transaction.atomic():
        pool, region = data["pool"], data["region"]
        if not pool.regions.filter(region=region).exists():
            object_save(principal=principal, obj=PoolRegion(pool=pool, region=region), action="create")
        return object_save(principal=principal, obj=Member(), action="create", data=data)


def member_set_state(*, principal: Principal | None, member: Member, admin_state: str | None = None,
                     weight: int | None = None) -> Member:
    """Drain/maint/ready and weight: desired state now, runtime API on every node right after commit."""
    data: dict[str, Any] = {}
    if admin_state is not None:
        data["admin_state"] = admin_state
    if weight is not None:
        data["weight"] = weight
    with transaction.atomic():
        object_save(principal=principal, obj=member, action="state", data=data)
        transaction.on_commit(lambda: member_runtime_changed.send(sender=Member, member_id=member.pk))
    return member


# --- hostname claims ---------------------------------------------------------------


def _check_claim_free(hostname: str, *, org_id: int, exclude_pk: int | None = None) -> None:
    """No two approved claims overlap, and an org asks for a name once (call under the "hostname-claims" lock).

    Another org's *pending* claim blocks nothing: otherwise any tenant could squat a competitor's domain by
    asking for it, until an operator got round to rejecting the request. Overlaps are decided at approval.
    """
    others = (claims_related([hostname]).filter(Q(status=HostnameClaim.Status.APPROVED)
                                                 | Q(org_id=org_id, status=HostnameClaim.Status.PENDING))
              .exclude(pk=exclude_pk))
    for other in others:
        if hostnames.overlaps(other.hostname, hostname):
            # Never say who holds it: that would leak another tenant's claim.
            raise Conflict("claim_overlap",
                           f"'{hostname}' overlaps a hostname that is already claimed.", field="hostname")


def hostname_claim_create(*, principal: Principal, org, hostname: str) -> HostnameClaim:
    hostname = hostnames.normalize(hostname)
    if hostnames.is_public_suffix(hostname):
        raise DomainError("public_suffix", f"'{hostname}' is a public suffix: many unrelated owners register names "
                          "under it, so no one can claim it whole. Claim your own name under it instead.",
                          field="hostname")
    with transaction.atomic():
        # Serialise claim creation so two orgs cannot both pass the overlap check.
        xact_lock("hostname-claims")
        _check_claim_free(hostname, org_id=org.pk)
        status = HostnameClaim.Status.APPROVED if principal.is_operator else HostnameClaim.Status.PENDING
        claim = HostnameClaim(org=org, hostname=hostname, status=status,
                              decided_at=timezone.now() if principal.is_operator else None)
        return object_save(principal=principal, obj=claim, action=AuditAction.CREATE)


def hostname_claim_warnings(claim: HostnameClaim) -> list[str]:
    """What an operator should know before approving a pending claim (never shown to the claiming tenant):
    it sits inside a name another org holds."""
    if claim.status != HostnameClaim.Status.PENDING:
        return []
    names, _ = hostnames.related(claim.hostname)
    held = (HostnameClaim.objects.filter(status=HostnameClaim.Status.APPROVED).exclude(org_id=claim.org_id)
            .select_related("org"))
    found = [other for other in held.filter(hostname__in={n.removeprefix("*.") for n in names} | names)
             if hostnames.inside(claim.hostname, other.hostname)]
    return [f"Inside {other.hostname}, which {other.org.slug} holds: approve only if {other.org.slug} agrees."
            for other in found]


def hostname_claim_decide(*, principal: Principal, claim: HostnameClaim, approve: bool) -> HostnameClaim:
    if not principal.is_operator:
        raise DomainError("operator_only", "Only an operator can approve or reject a hostname claim.", status=403)
    status = HostnameClaim.Status.APPROVED if approve else HostnameClaim.Status.REJECTED
    with transaction.atomic():
        xact_lock("hostname-claims")
        if approve:
            # A rejected claim was not held while rejected: another org may own the name since.
            _check_claim_free(claim.hostname, org_id=claim.org_id, exclude_pk=claim.pk)
        return object_save(principal=principal, obj=claim, action="approve" if approve else "reject",
                           data={"status": status, "decided_at": timezone.now()})


def hostname_claim_delete(*, principal: Principal, claim: HostnameClaim) -> None:
    """Refused (409 `in_use`) while a route of the org serves a host only this claim covers."""
    with transaction.atomic():
        xact_lock("hostname-claims")
        if claim.status == HostnameClaim.Status.APPROVED:
            others = list(HostnameClaim.objects.filter(org_id=claim.org_id, status=HostnameClaim.Status.APPROVED)
                          .exclude(pk=claim.pk).values_list("hostname", flat=True))
            for hosts in Route.objects.filter(org_id=claim.org_id).values_list("hosts", flat=True):
                for host in hosts or []:
                    if hostnames.covers(claim.hostname, host) and not any(hostnames.covers(o, host) for o in others):
                        raise Conflict("in_use", f"A route still serves '{host}'; change or delete the route first.")
        object_delete(principal=principal, obj=claim)


# --- routes --------------------------------------------------------------------------


def route_save(*, principal: Principal, route: Route, data: dict[str, Any]) -> Route:
    """Create or update a route from validated data; `data["targets"]` absent keeps the current targets."""
    data = dict(data)
    targets: list[dict[str, Any]] | None = data.pop("targets", None)
    lb_id = data["lb"].pk if "lb" in data else route.lb_id
    before = audit_snapshot(route) if route.pk else None
    for field, value in data.items():
        setattr(route, field, value)
    route.hosts = sorted({hostnames.normalize(h) for h in route.hosts})
    quotas.check_write_rate(route.org, "route_changes_per_minute")  # before the LB's lock: a refusal waits for none
    # What reads no other route is checked before the LB's lock, which orders every route write of the LB: its
    # holder's time is the LB's whole write rate. So is the read of the routes it is checked against (early_peers),
    # kept under the lock when the journal names no route written since that concerns it (bench-scale's sustained
    # phase: the lock held 20.6-22.1 ms a write instead of 24.6-24.9, on a 2-core machine at 1.2x the reference).
    if targets is not None:
        check_route(route=route, targets=targets)
    _ = principal.name  # the audit record's words for the caller: a query, cached on the principal
    early = early_peers(route)  # kept under the lock if no route written meanwhile concerns this one
    with transaction.atomic():
        # One writer per LB at a time: the uniqueness and shadowing rules span rows. Taken before anything is
        # written: a write holding an uncommitted priority while it waited for the lock could deadlock with the
        # holder writing that same priority (a default one, or a config-code apply's next route).
        locked = _LB_LOCKED.first(lb_id=lb_id)
        if targets is None:  # a partial update keeps the current targets
            targets = ([{"pool": t.pool, "weight": t.weight} for t in route.targets.select_related("pool")]
                       if route.pk else [])
            check_route(route=route, targets=targets)
        if before is None:
            quotas.check_count(route.org, "routes")
        if route.priority is None:  # a free one of the org's own
            route.priority = queries.free_priority(route)
        check_peers(principal, route, early, locked)
        route.save()
        if before is not None:  # a new route has no targets to replace
            route.targets.all().delete()
        written = RouteTarget.objects.bulk_create(
            [RouteTarget(route=route, pool=t["pool"], weight=t["weight"]) for t in targets])
        # The audit record and the caller's answer read the targets: they are the rows just written, so they are
        # given to the route as its prefetched targets instead of read back under the LB's lock (a fifth of its
        # holder's Python at 100k routes: py-spy on the web processes, bench-scale's sustained phase).
        _prefetched(route, "targets", sorted(written, key=lambda t: t.pool_id))  # the model's order
        audit_record(principal=principal, org=route.org, action="route.create" if before is None else "route.update",
                     obj=route, before=before, after=audit_snapshot(route))
        lb_touch(route.lb_id, route_ids=[route.pk])
    return route


def _prefetched(obj, name: str, rows: list) -> None:
    """Set `rows` as `obj`'s prefetched reverse relation `name`, as prefetch_related_objects leaves it (Django's
    prefetch_one_level sets the same two attributes; tests/balancers/test_route_save.py fails if a read comes back)."""
    cache = obj.__dict__.setdefault("_prefetched_objects_cache", {})
    cache.pop(name, None)  # else the manager answers the cached queryset
    found = getattr(obj, name).all()
    found._result_cache, found._prefetch_done = rows, True
    cache[name] = found


# --- static IPs --------------------------------------------------------------------------


def static_ip_allocate(*, principal: Principal, pool: IpPool, org, address: str | None = None) -> StaticIP:
    """Take one address from the pool, atomically: never the same address twice."""
    with transaction.atomic():
        # The pool row lock serialises allocators of one pool on PostgreSQL; SQLite
        # serialises all writers anyway. The org's row lock makes its quota count exact.
        IpPool.objects.select_for_update().get(pk=pool.pk)
        type(org).objects.select_for_update().filter(pk=org.pk).first()
        quotas.check_count(org, "static_ips")
        network = ipaddress.ip_network(pool.cidr, strict=False)
        taken = set(StaticIP.objects.filter(pool=pool).exclude(state=StaticIP.State.FREE)
                    .values_list("address", flat=True))
        if address is not None:
            if ipaddress.ip_address(address) not in network:
                raise DomainError("address_not_in_pool", f"{address} is not inside {pool.cidr}.", field="address")
            if ipaddress.ip_address(address) not in set(network.hosts()) and network.num_addresses > 2:
                raise DomainError("address_not_usable", f"{address} is the network or broadcast address of "
                                  f"{pool.cidr}; no host can hold it.", field="address")
            if address in taken:
                raise Conflict("address_taken", f"{address} is already allocated.", field="address")
            chosen = address
        else:
            chosen = next((str(ip) for ip in network.hosts() if str(ip) not in taken), None)
            if chosen is None:
                raise Conflict("pool_exhausted", f"IP pool '{pool.name}' has no free address left.")
        ip, _ = StaticIP.objects.update_or_create(
            address=chosen,
            defaults={"pool": pool, "org": org, "state": StaticIP.State.RESERVED, "allocated_at": timezone.now()},
        )
        audit_record(principal=principal, org=org, action="static_ip.allocate", obj=ip, after=audit_snapshot(ip))
    return ip


def static_ip_release(*, principal: Principal, ip: StaticIP) -> StaticIP:
    with transaction.atomic():
        ip = StaticIP.objects.select_for_update().get(pk=ip.pk)
        if ip.listeners.exists():
            raise Conflict("in_use", f"{ip.address} is still bound by a listener; move the listener first.")
        before, org = audit_snapshot(ip), ip.org
        ip.state, ip.org, ip.allocated_at = StaticIP.State.FREE, None, None
        ip.save()
        audit_record(principal=principal, org=org, action="static_ip.release", obj=ip, before=before,
                     after=audit_snapshot(ip))
    return ip


def listener_save(*, principal: Principal, listener: Listener, data: dict[str, Any]) -> Listener:
    with transaction.atomic():
        old_ip_id = listener.static_ip_id
        object_save(principal=principal, obj=listener, data=data)  # create or update
        _check_port_free(listener, principal)
        _check_vip_floats(listener)
        ip = listener.static_ip
        if ip is not None:
            if ip.state == StaticIP.State.FREE or (ip.org_id not in (listener.lb.org_id, None)
                                                   and not principal.is_operator):
                raise DomainError("static_ip_not_reserved", "That static IP is not reserved for your organization.",
                                  field="static_ip")
            StaticIP.objects.filter(pk=ip.pk).update(state=StaticIP.State.ASSIGNED)
        if (old_ip_id and old_ip_id != listener.static_ip_id
                and not Listener.objects.filter(static_ip_id=old_ip_id).exists()):
            StaticIP.objects.filter(pk=old_ip_id).update(state=StaticIP.State.RESERVED)
        if old_ip_id != listener.static_ip_id:
            # Its own audit event whichever way it came (API PATCH, workspace form, listener create), so
            # "who moved our address" is one query.
            before = StaticIP.objects.filter(pk=old_ip_id).values_list("address", flat=True).first()
            after = ip.address if ip is not None else None
            audit_record(principal=principal, org=listener.lb.org,
                         action="static_ip.attach" if after else "static_ip.detach", obj=listener,
                         before={"static_ip": before}, after={"static_ip": after})
    return listener


def listener_static_ip_set(*, principal: Principal, listener: Listener, static_ip: StaticIP | None) -> Listener:
    """Attach a static IP to a listener (it becomes a floating VIP of the fleets serving it) or detach it
    (listener_save audits either as static_ip.attach / static_ip.detach). The caller has already resolved
    `static_ip` through the principal's scope; listener_save refuses an IP not reserved for the LB's org."""
    return listener_save(principal=principal, listener=listener, data={"static_ip": static_ip})


def _serving_fleet_ids(lb: LoadBalancer) -> set[int]:
    fleet_ids = set(lb.serving_fleets.values_list("pk", flat=True))
    if lb.fleet_id:
        fleet_ids.add(lb.fleet_id)
    return fleet_ids


def _check_vip_floats(listener: Listener) -> None:
    """A static IP on a listener floats between the nodes of every fleet serving it (keepalived): refuse
    one that could not (the render would have to leave it out). Named without the other tenant's VIP."""
    if listener.static_ip is None:
        return
    address = listener.static_ip.address
    fleet_ids = _serving_fleet_ids(listener.lb)
    if not fleet_ids:
        return
    others = (Listener.objects.filter(Q(lb__fleet_id__in=fleet_ids) | Q(lb__serving_fleets__in=fleet_ids),
                                      static_ip__isnull=False)
              .exclude(pk=listener.pk).exclude(static_ip__address=address)
              .values_list("static_ip__address", flat=True).distinct())
    if any(vrrp.vrid_for(other) == vrrp.vrid_for(address) for other in others):
        raise Conflict("vrid_collision", f"{address} cannot float on the fleet serving this load balancer: its "
                       "VRRP router id is taken by another address there. Reserve another address.",
                       field="static_ip")
    # Nodes that run keepalived, reached through the fleets' reverse relation (balancers sits below fleets).
    lb = listener.lb
    node_addresses = [
        *LoadBalancer.objects.filter(pk=lb.pk, fleet__nodes__vrrp_interface__gt="")
        .values_list("fleet__nodes__address", flat=True),
        *lb.serving_fleets.filter(nodes__vrrp_interface__gt="").values_list("nodes__address", flat=True),
    ]
    if any(vrrp.family(a) != vrrp.family(address) for a in node_addresses):
        raise Conflict("vip_family", f"{address} is not of the IP family of the fleet's nodes, so it cannot "
                       "float there.", field="static_ip")


def _check_port_free(listener: Listener, principal: Principal | None) -> None:
    """A listener must bind what no other listener on the same fleets binds (the fleet's render would leave
    one of them out), and a customer only ports the operator opened to tenants (not the node's sshd).
    Refused without naming the other listener: it may be another tenant's."""
    if principal is not None and not principal.is_operator and not netpolicy.port_allowed(
            listener.port, settings.TENANT_LISTENER_PORTS):
        raise DomainError("port_not_allowed", f"Port {listener.port} is not open to tenants' listeners here; "
                          f"use one of {settings.TENANT_LISTENER_PORTS}.", field="port")
    lb = listener.lb
    fleets = {f.pk: f for f in lb.serving_fleets.all()}
    if lb.fleet_id:
        fleets[lb.fleet_id] = lb.fleet
    if not fleets:
        return
    fleet_ids = sorted(fleets)
    for fleet_id in fleet_ids:
        xact_lock(f"fleet-ports:{fleet_id}")  # two tenants taking one port at once: the second waits and sees it
    # A node with a bind_address binds every listener there: one port, one listener, whatever the static IPs.
    one_address = any(f.nodes.filter(bind_address__isnull=False).exists() for f in fleets.values())
    others = (Listener.objects.filter(Q(lb__fleet_id__in=fleet_ids) | Q(lb__serving_fleets__in=fleet_ids),
                                      port=listener.port)
              .exclude(pk=listener.pk).select_related("static_ip"))
    mine = listener.static_ip.address if listener.static_ip else None
    for other in others:
        theirs = other.static_ip.address if other.static_ip else None
        if one_address or mine is None or theirs is None or mine == theirs:
            raise Conflict("port_in_use", f"Port {listener.port} is already bound on a fleet that serves this "
                           "load balancer; choose another port or a static IP of your own.", field="port")


def member_address_check(*, principal: Principal | None, pool: Pool, address: str) -> None:
    """A pool member is proxied and health-checked by the fleet: never metadata or link-local, and a
    private or loopback address only in a network the operator allowed (globally or for the pool's org)."""
    allowed = netpolicy.parse_networks([*settings.MEMBER_NETWORKS, *pool.org.member_networks])
    reason = netpolicy.member_address_refusal(
        address, may_use_private=principal is not None and principal.is_operator, allowed=allowed)
    if reason:
        raise DomainError("member_forbidden_address", reason, field="address")
