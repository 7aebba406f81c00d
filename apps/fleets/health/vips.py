"""Who holds each floating VIP now, read from the nodes themselves (never inferred from priorities).

keepalived decides the holder; Spillway only observes it: each VRRP node of the fleet is asked for
the addresses on its interfaces (`ip -o addr` through its transport), in parallel.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from django.db.models import Q

from apps.balancers.models import Listener, LoadBalancer
from apps.fleets import queries
from apps.fleets.models import Fleet, Node
from apps.fleets.node.outside_rollout import held_addresses


@dataclass(frozen=True)
class VipHolding:
    address: str
    holders: tuple[str, ...]  # node names; more than one is a split brain, none an outage
    unreachable: tuple[str, ...]  # VRRP nodes that could not be asked

    @property
    def healthy(self) -> bool:
        return len(self.holders) == 1


def fleet_vip_holders(fleet: Fleet, vips: list[str]) -> dict[str, VipHolding]:
    """{vip: VipHolding} for the fleet's VRRP nodes."""
    nodes: list[Node] = queries.vrrp_nodes(fleet.pk)
    if not nodes or not vips:
        return {vip: VipHolding(vip, (), ()) for vip in vips}
    conns = [queries.node_conn(n) for n in nodes]
    with ThreadPoolExecutor(max_workers=min(8, len(conns))) as pool:
        held = list(pool.map(held_addresses, conns))
    unreachable = tuple(c.name for c, h in zip(conns, held, strict=True) if h is None)
    return {
        vip: VipHolding(vip, tuple(c.name for c, h in zip(conns, held, strict=True) if h and vip in h), unreachable)
        for vip in vips
    }


@dataclass(frozen=True)
class FleetVip:
    """One serving fleet's view of a listener's VIP: who holds it now and how those nodes are doing."""

    fleet: Fleet
    region: str
    state: str  # "ok", "no holder" or "split brain"
    holders: tuple[tuple[str, str], ...]  # (node name, node status)
    unreachable: tuple[str, ...]


NOT_SERVED = ("not served: nothing answers on this address (no fleet serving this load balancer runs keepalived "
              "to hold it)")


def unserved_static_ips(listeners) -> set[int]:
    """Ids of the listeners in `listeners` whose static IP no node answers on: an HAProxy load balancer none of
    whose serving fleets has a node running keepalived (the address is attached, but nothing holds it).
    Two queries for any number of listeners."""
    listeners = [ln for ln in listeners if ln.static_ip_id and ln.lb.kind == LoadBalancer.Kind.HAPROXY]
    if not listeners:
        return set()
    lb_ids = {ln.lb_id for ln in listeners}
    floating = set(Node.objects.filter(enabled=True).exclude(vrrp_interface="").values_list("fleet_id", flat=True))
    served_lbs = set(LoadBalancer.objects.filter(pk__in=lb_ids).filter(
        Q(fleet_id__in=floating) | Q(serving_fleets__in=floating)).values_list("pk", flat=True))
    return {ln.pk for ln in listeners if ln.lb_id not in served_lbs}


def listener_vip(listener: Listener) -> list[FleetVip]:
    """VIP -> holder -> health for `listener`, per fleet serving its LB that runs keepalived (the UI's
    listener cell and the API read the same thing). Empty when no static IP is attached."""
    lb: LoadBalancer = listener.lb
    if not listener.static_ip_id or lb.kind != LoadBalancer.Kind.HAPROXY:
        return []
    vip = listener.static_ip.address
    rows = []
    for fleet in queries.lb_fleets(lb).select_related("region"):
        if not queries.vrrp_nodes(fleet.pk):
            continue
        holding = fleet_vip_holders(fleet, [vip])[vip]
        status = dict(fleet.nodes.values_list("name", "status"))
        state = "ok" if holding.healthy else ("no holder" if not holding.holders else "split brain")
        rows.append(FleetVip(fleet=fleet, region=fleet.region.slug, state=state,
                             holders=tuple((name, status.get(name, "unknown")) for name in holding.holders),
                             unreachable=holding.unreachable))
    return rows
