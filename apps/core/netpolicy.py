"""Address classes the control plane refuses to aim traffic at, shared by every rule that does.

A capacity test target, a pool member (the shared fleet proxies and health-checks it) and a webhook
all end as connections from Spillway's infrastructure; the cloud metadata service and link-local
addresses must never be one of them, and private or loopback ranges only where an operator allows.
Pure: no Django.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


def _nets(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(c) for c in cidrs)


# Checked in this order; the first match names the class in the error message.
METADATA = _nets("169.254.169.254/32", "fd00:ec2::254/128")
ADDRESS_CLASSES: tuple[tuple[str, tuple[IPNetwork, ...]], ...] = (
    ("unspecified", _nets("0.0.0.0/8", "::/128")),
    ("multicast", _nets("224.0.0.0/4", "ff00::/8")),
    ("reserved", _nets("240.0.0.0/4")),  # includes 255.255.255.255 (broadcast)
    ("metadata", METADATA),
    ("link-local", _nets("169.254.0.0/16", "fe80::/10")),
    ("loopback", _nets("127.0.0.0/8", "::1/128")),
    ("private", _nets("10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "100.64.0.0/10", "fc00::/7",
                      "fec0::/10")),
)
# No allowlist makes these valid targets: they are not unicast hosts (and connecting to 0.0.0.0
# reaches the local machine on Linux, a classic SSRF bypass).
NEVER_ALLOWED = frozenset({"unspecified", "multicast", "reserved"})
# Never a backend: the shared fleet would proxy tenants' requests to the node's own metadata service.
NEVER_A_MEMBER = NEVER_ALLOWED | {"metadata", "link-local"}


def parse_ip(text: str) -> IPAddress | None:
    try:
        ip = ipaddress.ip_address(str(text).strip("[]"))
    except ValueError:
        return None
    # ::ffff:169.254.169.254 is 169.254.169.254 to the kernel: judge the IPv4 inside.
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def address_class(ip: IPAddress) -> str | None:
    """The restricted class an address belongs to, or None for a public unicast address."""
    for name, nets in ADDRESS_CLASSES:
        if any(ip.version == net.version and ip in net for net in nets):
            return name
    return None


def parse_networks(cidrs: Iterable[str]) -> list[IPNetwork]:
    out = []
    for cidr in cidrs:
        try:
            out.append(ipaddress.ip_network(cidr, strict=False))
        except ValueError:
            continue
    return out


def member_address_refusal(text: str, *, may_use_private: bool, allowed: Iterable[IPNetwork]) -> str | None:
    """Why `text` cannot be a pool member's address, or None when it can.

    Metadata, link-local and non-unicast addresses never; loopback and private ranges when the caller
    may use them (operators) or an operator allowed a network covering them for the pool's org.
    """
    ip = parse_ip(text)
    if ip is None:
        return f"{text!r} is not an IP address."
    kind = address_class(ip)
    if kind is None:
        return None
    if kind in NEVER_A_MEMBER:
        return f"{ip} is a {kind} address; a member must be a unicast host the fleet may reach."
    if may_use_private or any(ip.version == net.version and ip in net for net in allowed):
        return None
    return (f"{ip} is a {kind} address; an operator must allow that network for your organization "
            f"before members may use it.")


# --- ports: one parser for every port list (tenant listener ports, capacity allowlist entries) ----------

# ASCII digits only and the whole string (not \d, which takes full-width digits, nor $, which allows a final newline).
_PORTS_RE = re.compile(r"[0-9]{1,5}(-[0-9]{1,5})?(,[0-9]{1,5}(-[0-9]{1,5})?)*")


def parse_ports(spec: str) -> list[tuple[int, int]]:
    """"80,443,8000-8099" -> [(80, 80), (443, 443), (8000, 8099)]; ValueError on anything else."""
    spec = spec.replace(" ", "")
    if not spec:
        return []
    if not _PORTS_RE.fullmatch(spec):
        raise ValueError(f"{spec!r} is not a list of ports and ranges like 80,443,8000-8099")
    ranges = []
    for part in spec.split(","):
        low, _, high = part.partition("-")
        lo, hi = int(low), int(high or low)
        if not 1 <= lo <= hi <= 65535:
            raise ValueError(f"{part!r} is not a port range within 1-65535")
        ranges.append((lo, hi))
    return ranges


def port_allowed(port: int, spec: str) -> bool:
    """Is `port` in the port list `spec` ("80,443,1024-65535"; empty: none)?"""
    return any(lo <= port <= hi for lo, hi in parse_ports(spec))
