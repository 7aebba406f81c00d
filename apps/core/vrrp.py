"""VRRP facts shared by the layer that attaches static IPs (balancers) and the one that renders them
(fleets.render.keepalived), so an attach can refuse what the render would have to leave out."""

from __future__ import annotations

import ipaddress


def vrid_for(address: str) -> int:
    """VRRP virtual router id (1..255) of a VIP: stable whatever other VIPs exist.

    Consecutive addresses of a pool get distinct ids for 255 addresses in a row; two VIPs of one fleet
    that derive the same id cannot both float there.
    """
    return int(ipaddress.ip_address(address)) % 255 + 1


def family(address: str) -> int:
    return ipaddress.ip_address(address).version
