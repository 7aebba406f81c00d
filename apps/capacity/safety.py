"""Where a capacity test may aim, and how hard: a control plane must not become an attack tool.

Pure rules (address classes, ownership, caps) plus one selector, `target_resolve`, that gathers the
facts from the database and resolves the target's address once. Shards then connect to that IP and
never ask DNS again, so a name cannot be re-pointed at something else mid-run (DNS rebinding).
"""

from __future__ import annotations

import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from apps.balancers import hostnames
from apps.core.errors import DomainError
from apps.core.netpolicy import (  # noqa: F401  (re-exported: callers read the classes from here)
    ADDRESS_CLASSES,
    METADATA,
    NEVER_ALLOWED,
    IPAddress,
    IPNetwork,
    address_class,
    parse_ip,
    parse_networks,
    port_allowed,
)

TARGET_NOT_OWNED = "target_not_owned"
TARGET_FORBIDDEN_ADDRESS = "target_forbidden_address"
TARGET_UNRESOLVABLE = "target_unresolvable"
TARGET_UNSUPPORTED = "target_unsupported"
CAP_EXCEEDED = "cap_exceeded"



def check_address(text: str, allowed: Sequence[IPNetwork]) -> IPAddress:
    """Refuse an address in a restricted class unless an allowlisted network covers it.

    The metadata service needs an allowlist entry for exactly that address: a broad
    169.254.0.0/16 entry meant for link-local test rigs must not open it by accident.
    """
    ip = parse_ip(text)
    if ip is None:
        raise DomainError(TARGET_UNRESOLVABLE, f"{text!r} is not an IP address.", field="target")
    kind = address_class(ip)
    if kind is None:
        return ip
    if kind not in NEVER_ALLOWED:
        for net in allowed:
            if ip.version != net.version or ip not in net:
                continue
            if kind == "metadata" and net.num_addresses != 1:
                continue
            return ip
    hint = "" if kind in NEVER_ALLOWED else " unless an operator allowlists it"
    raise DomainError(
        TARGET_FORBIDDEN_ADDRESS,
        f"The target resolves to {ip}, a {kind} address; capacity tests may not aim there{hint}.",
        field="target",
    )


# --- ownership -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ListenerFacts:
    id: int
    lb_org_id: int
    lb_shared: bool
    protocol: str
    port: int
    address: str | None  # the listener's static IP, if it has one


def check_listener_owned(
    *, org_id: int, is_operator: bool, listener: ListenerFacts, hostname: str, approved_claims: Iterable[str]
) -> None:
    """A tenant aims only at its own LBs' listeners, or at a shared LB under a hostname it claimed.

    Operators run the shared infrastructure, so any listener is theirs to test.
    """
    if is_operator or listener.lb_org_id == org_id:
        return
    if not listener.lb_shared:
        raise not_owned(f"listener {listener.id}")
    if not hostname:
        raise DomainError(
            TARGET_NOT_OWNED,
            "On a shared load balancer a test must name one of your organization's claimed hostnames.",
            field="hostname",
        )
    if hostname.startswith("*.") or not any(hostnames.covers(c, hostname) for c in approved_claims):
        raise DomainError(
            TARGET_NOT_OWNED,
            f"'{hostname}' is not covered by an approved hostname claim of your organization.",
            field="hostname",
        )


def not_owned(what: str) -> DomainError:
    # Same sentence whether the object exists or belongs to someone else: no existence leak.
    return DomainError(
        TARGET_NOT_OWNED,
        f"The target ({what}) is not one of your organization's load balancer listeners "
        "nor an operator-allowlisted target.",
        field="listener",
    )


@dataclass(frozen=True)
class AllowEntry:
    cidr: str = ""
    hostname: str = ""
    ports: str = ""


def external_allowed(host: str, entries: Iterable[AllowEntry], port: int | None = None) -> bool:
    """May an external (non-listener) host be targeted on `port`? A hostname entry or, for IPs, a CIDR
    entry, whose ports include `port` (None: only the host is asked about, e.g. a Host header)."""
    ip = parse_ip(host)
    for entry in entries:
        if port is not None and not port_allowed(port, entry.ports):
            continue
        if ip is None and entry.hostname and hostnames.covers(entry.hostname, host):
            return True
        if ip is not None and entry.cidr:
            nets = parse_networks([entry.cidr])
            if nets and ip.version == nets[0].version and ip in nets[0]:
                return True
    return False


# --- caps ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caps:
    max_rate: float  # req/s, the org's whole budget
    max_duration_s: float
    max_concurrency: int  # connections / users


@dataclass(frozen=True)
class Load:
    peak_rate: float  # req/s an open-loop plan offers at most; 0 for closed loop (unknown up front)
    schedule_s: float
    concurrency: int


def cap_violations(load: Load, caps: Caps) -> list[str]:
    out = []
    if load.peak_rate > caps.max_rate:
        out.append(f"peak rate {load.peak_rate:g} req/s exceeds your organization's cap of {caps.max_rate:g} req/s")
    if load.schedule_s > caps.max_duration_s:
        out.append(f"duration {load.schedule_s:g} s exceeds the cap of {caps.max_duration_s:g} s")
    if load.concurrency > caps.max_concurrency:
        out.append(f"concurrency {load.concurrency} exceeds the cap of {caps.max_concurrency}")
    return out


def check_caps(load: Load, caps: Caps) -> None:
    problems = cap_violations(load, caps)
    if problems:
        text = "; ".join(problems)
        raise DomainError(CAP_EXCEEDED, text[0].upper() + text[1:] + ".", field="steps")


def check_budget(load: Load, active: Sequence[Load], caps: Caps) -> None:
    """Runs of one org that overlap in time share its caps: two tests at the cap are twice the cap."""
    rate = load.peak_rate + sum(a.peak_rate for a in active)
    concurrency = load.concurrency + sum(a.concurrency for a in active)
    if rate > caps.max_rate or concurrency > caps.max_concurrency:
        raise DomainError(
            CAP_EXCEEDED,
            f"With the {len(active)} run(s) already active your organization would offer {rate:g} req/s "
            f"over {concurrency} connections; the caps are {caps.max_rate:g} req/s and "
            f"{caps.max_concurrency} connections. Wait for them to finish or cancel one.",
            status=409,
        )


# How far over the rate cap the measured rate may go before a run is stopped: completions arrive
# in bursts after a hiccup, so one 0.5 s sample slightly over the cap is not abuse.
RATE_TOLERANCE = 1.25


def running_violation(
    *, load: Load, caps: Caps, elapsed_s: float, drain_allowance_s: float, achieved_rates: Sequence[float]
) -> str | None:
    """Why a running run must stop now, or None. `achieved_rates`: recent samples, newest last."""
    problems = cap_violations(load, caps)
    if problems:
        return "the organization's caps were lowered below this run: " + "; ".join(problems)
    if elapsed_s > caps.max_duration_s + drain_allowance_s:
        return f"ran {elapsed_s:.1f} s, past the duration cap of {caps.max_duration_s:g} s"
    limit = caps.max_rate * RATE_TOLERANCE
    recent = list(achieved_rates)[-2:]
    if len(recent) == 2 and all(r > limit for r in recent):
        return (f"measured {recent[-1]:.0f} req/s, over the rate cap of {caps.max_rate:g} req/s "
                "(closed-loop users are not rate-limited, so the cap is enforced while running)")
    return None


# --- resolution ------------------------------------------------------------------------------


@dataclass(frozen=True)
class ResolvedTarget:
    address: str  # the IP every shard connects to
    port: int
    host_header: str
    path: str
    description: str


def authority(host: str, port: int) -> str:
    """Host header value for a host and port (IPv6 literals in brackets, port 80 implied)."""
    shown = f"[{host}]" if ":" in host else host
    return shown if port == 80 else f"{shown}:{port}"


def resolve_host(host: str, port: int) -> list[str]:
    """Every address the name resolves to (all are checked: one bad record refuses the target)."""
    ip = parse_ip(host)
    if ip is not None:
        return [str(ip)]
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise DomainError(TARGET_UNRESOLVABLE, f"'{host}' does not resolve: {exc}.", field="address") from exc
    seen: list[str] = []
    for info in infos:
        addr = str(parse_ip(str(info[4][0])))
        if addr not in seen:
            seen.append(addr)
    return seen


def target_resolve(*, test) -> ResolvedTarget:
    """Check that `test` (a CapacityTest, saved or not) may aim where it aims; return where to connect.

    Raises DomainError target_not_owned / target_forbidden_address / target_unresolvable.
    """
    from django.db.models import Q

    from apps.balancers.models import HostnameClaim, Listener, Route
    from apps.capacity.models import TargetAllowlist

    org = test.org
    entries = [AllowEntry(cidr=e.cidr, hostname=e.hostname, ports=e.ports) for e in
               TargetAllowlist.objects.filter(Q(org=org) | Q(org__isnull=True))]
    allowed_nets = parse_networks(e.cidr for e in entries if e.cidr)
    hostname = hostnames.normalize(test.hostname) if test.hostname else ""
    path = test.path or "/"

    if test.listener_id is None:
        host, port = test.address, test.port
        if not host or not port:
            raise DomainError(TARGET_NOT_OWNED, "Name a listener of your load balancers (or an allowlisted "
                                                "address and port).", field="listener")
        if not external_allowed(host, entries, port):
            raise not_owned(f"{host}:{port}")
        if hostname and not org.is_operator and not _host_header_owned(org, hostname, entries):
            # The Host header is another way to aim: it picks whose routes a shared LB serves.
            raise DomainError(TARGET_NOT_OWNED, f"The hostname {hostname} is not one your organization has "
                                                "claimed nor an allowlisted target.", field="hostname")
        addresses = resolve_host(host, port)
        for addr in addresses:
            check_address(addr, allowed_nets)
        header = hostname or authority(host, port)
        return ResolvedTarget(addresses[0], port, header, path, f"{host}:{port}")

    listener = (Listener.objects.select_related("lb", "static_ip").filter(pk=test.listener_id).first())
    if listener is None:
        raise not_owned(f"listener {test.listener_id}")
    facts = ListenerFacts(id=listener.pk, lb_org_id=listener.lb.org_id, lb_shared=listener.lb.shared,
                          protocol=listener.protocol, port=listener.port,
                          address=listener.static_ip.address if listener.static_ip else None)
    claims = HostnameClaim.objects.filter(org=org, status=HostnameClaim.Status.APPROVED).values_list(
        "hostname", flat=True)
    if test.route_id is not None:
        route = Route.objects.filter(pk=test.route_id).first()
        if route is None or route.lb_id != listener.lb_id or (route.org_id != org.pk and not org.is_operator):
            raise DomainError(TARGET_NOT_OWNED, "The route is not one of your routes on that load balancer.",
                              field="route")
        if not hostname and route.hosts:
            hostname = next((h for h in route.hosts if not h.startswith("*.")), "")
        if path == "/" and route.path and not route.redirect_url:
            path = route.path
    check_listener_owned(org_id=org.pk, is_operator=org.is_operator, listener=facts, hostname=hostname,
                         approved_claims=list(claims))
    if facts.protocol == "https":
        raise DomainError(TARGET_UNSUPPORTED, "The load engine speaks plain HTTP/1.1; pick an http listener.",
                          field="listener")
    address = _node_address(listener, test.region_id) or facts.address
    if address is None:
        raise DomainError(TARGET_UNRESOLVABLE, f"Listener {listener} has no static IP to send load to.",
                          field="listener")
    check_address(address, allowed_nets)
    header = hostname or authority(address, facts.port)
    return ResolvedTarget(str(parse_ip(address)), facts.port, header, path, f"{listener}")


def _node_address(listener, region_id: int | None) -> str | None:
    """Where the listener's HAProxy nodes actually listen, when that is not the listener's static IP:
    a node's `bind_address` (loopback and demo fleets override every listener's address), a node in
    the tested region first. None when the nodes bind the listener's own address."""
    from django.db.models import Q

    from apps.fleets.models import Node

    nodes = (Node.objects.filter(Q(fleet__load_balancers=listener.lb) | Q(fleet__serves=listener.lb), enabled=True)
             .exclude(bind_address__isnull=True).select_related("fleet").distinct())
    ranked = sorted(nodes, key=lambda n: (n.fleet.region_id != region_id, n.fleet.name, n.name))
    return ranked[0].bind_address if ranked else None


def _host_header_owned(org, hostname: str, entries: Iterable[AllowEntry]) -> bool:
    from apps.balancers.models import HostnameClaim

    claims = HostnameClaim.objects.filter(org=org, status=HostnameClaim.Status.APPROVED).values_list(
        "hostname", flat=True)
    return any(hostnames.covers(c, hostname) for c in claims) or external_allowed(hostname, entries)
