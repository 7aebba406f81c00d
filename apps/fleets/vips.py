"""Who holds each floating VIP now, read from the nodes themselves (never inferred from priorities).

keepalived decides the holder; Spillway only observes it: each VRRP node of the fleet is asked for
the addresses on its interfaces (`ip -o addr` through its transport), in parallel.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from apps.fleets import selectors
from apps.fleets.delivery import held_addresses
from apps.fleets.models import Fleet, Node


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
    nodes: list[Node] = selectors.vrrp_nodes(fleet.pk)
    if not nodes or not vips:
        return {vip: VipHolding(vip, (), ()) for vip in vips}
    conns = [selectors.node_conn(n) for n in nodes]
    with ThreadPoolExecutor(max_workers=min(8, len(conns))) as pool:
        held = list(pool.map(held_addresses, conns))
    unreachable = tuple(c.name for c, h in zip(conns, held, strict=True) if h is None)
    return {
        vip: VipHolding(vip, tuple(c.name for c, h in zip(conns, held, strict=True) if h and vip in h), unreachable)
        for vip in vips
    }
