"""Pure translation rules shared by the limit checker and the cdktf stacks (no cdktf import).

Keeping names, path patterns and the GCP host grouping here means `check_limits` counts exactly what the
stacks will create: a limit check that counted something else would pass a config the cloud rejects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from deploy.model import CloudLB, CloudRoute

# AWS region names carry no length budget of their own, but ALB and target group names do (32 characters),
# so regions are abbreviated the way AWS's own console and most tooling do (us-east-1 -> use1).
_AWS_REGION_WORDS = {
    "north": "n", "south": "s", "east": "e", "west": "w", "central": "c",
    "northeast": "ne", "northwest": "nw", "southeast": "se", "southwest": "sw",
}


def short_region(region: str) -> str:
    parts = region.split("-")
    if len(parts) < 3:
        return region.replace("-", "")
    head, middle, tail = parts[0], parts[1:-1], parts[-1]
    return head + "".join(_AWS_REGION_WORDS.get(word, word[:1]) for word in middle) + tail


# --- resource names -------------------------------------------------------------------------------------

def aws_alb_name(lb: CloudLB, region: str) -> str:
    return f"{lb.name}-{short_region(region)}"


def aws_target_group_name(lb: CloudLB, pool: str, region: str) -> str:
    return f"{lb.name}-{pool}-{short_region(region)}"


def gcp_address_name(lb: CloudLB) -> str:
    return f"{lb.name}-ip"


def gcp_health_check_name(lb: CloudLB, pool: str) -> str:
    return f"{lb.name}-{pool}-hc"


def gcp_neg_name(lb: CloudLB, pool: str, region: str) -> str:
    return f"{lb.name}-{pool}-{region}"


def gcp_backend_service_name(lb: CloudLB, pool: str) -> str:
    return f"{lb.name}-{pool}"


def gcp_url_map_name(lb: CloudLB, port: int) -> str:
    return f"{lb.name}-{port}"


def gcp_proxy_name(lb: CloudLB, port: int) -> str:
    return f"{lb.name}-{port}-proxy"


def gcp_forwarding_rule_name(lb: CloudLB, port: int) -> str:
    return f"{lb.name}-{port}-fr"


def gcp_resource_names(lb: CloudLB) -> list[str]:
    """Every name the GCP stack gives a resource (all share GCP's 63-character RFC 1035 rule)."""
    names = [gcp_address_name(lb)]
    for pool in lb.pools:
        names += [gcp_health_check_name(lb, pool.name), gcp_backend_service_name(lb, pool.name)]
        names += [gcp_neg_name(lb, pool.name, r.region) for r in pool.regions]
    for listener in lb.listeners:
        names += [gcp_url_map_name(lb, listener.port), gcp_proxy_name(lb, listener.port),
                  gcp_forwarding_rule_name(lb, listener.port)]
    return names


# --- paths and hosts -------------------------------------------------------------------------------------

def aws_path_pattern(route: CloudRoute) -> str:
    # AWS path patterns are globs; a Spillway prefix is a plain prefix, so "/api" becomes "/api*".
    return route.path + "*" if route.path_match == "prefix" else route.path


def host_covers(pattern: str, host: str) -> bool:
    """True when every request host matched by `host` is also matched by `pattern`.

    Both may be wildcards ("*.example.com"); a wildcard stands for one or more leading characters, as in
    GCP host rules and AWS host-header conditions.
    """
    if pattern == host:
        return True
    if not pattern.startswith("*"):
        return False
    suffix = pattern[1:]
    return host.endswith(suffix) and len(host) > len(suffix)


ANY_HOST = "*"


@dataclass(frozen=True)
class HostGroup:
    """One GCP host rule and its path matcher: the hosts that see exactly the same routes."""

    matcher: str
    hosts: tuple[str, ...]
    routes: tuple[CloudRoute, ...]


def gcp_host_groups(lb: CloudLB) -> list[HostGroup]:
    """Group hosts into GCP host rules so GCP evaluates routes as AWS and HAProxy do: by priority alone.

    GCP picks a host rule first (an exact host beats a wildcard) and only then looks at routes. So the
    matcher for a host must also carry every wildcard route covering that host and every host-less route,
    or a higher-priority wildcard route would be skipped for that host. Host-less routes also get a "*"
    host rule of their own, for hosts no route names.
    """
    hostless = [r for r in lb.routes if not r.hosts]
    exact: dict[str, list[CloudRoute]] = {}
    wildcards: dict[str, list[CloudRoute]] = {}
    for route in lb.routes:
        for host in route.hosts:
            (wildcards if host.startswith("*") else exact).setdefault(host.lower(), []).append(route)

    by_route_set: dict[tuple[int, ...], list[str]] = {}
    routes_of: dict[tuple[int, ...], list[CloudRoute]] = {}
    for host in sorted(set(exact) | set(wildcards)):
        applicable = {id(r): r for r in exact.get(host, []) + wildcards.get(host, []) + hostless}
        for pattern, routes in wildcards.items():
            if pattern != host and host_covers(pattern, host):
                applicable.update({id(r): r for r in routes})
        ordered = sorted(applicable.values(), key=lambda r: r.priority)
        key = tuple(r.priority for r in ordered)
        by_route_set.setdefault(key, []).append(host)
        routes_of[key] = ordered

    groups = [(tuple(hosts), tuple(routes_of[key])) for key, hosts in by_route_set.items()]
    groups.sort(key=lambda g: g[0][0])
    result = [HostGroup(matcher=f"hosts-{i}", hosts=hosts, routes=routes)
              for i, (hosts, routes) in enumerate(groups)]
    if hostless:
        ordered = tuple(sorted(hostless, key=lambda r: r.priority))
        result.append(HostGroup(matcher="any-host", hosts=(ANY_HOST,), routes=ordered))
    return result


# --- allowlists (shared with limits; use fullmatch: "$" alone also matches before a trailing newline) ------

SLUG_RE = re.compile(r"^[a-z]([a-z0-9-]*[a-z0-9])?$")
HOST_RE = re.compile(r"^(\*[.-])?[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*$")
# The characters AWS path patterns accept, minus the glob characters (* and ?), which GCP would treat
# literally, and & and quotes, which AWS needs escaped: a path means the same thing on both clouds.
PATH_RE = re.compile(r"^/[A-Za-z0-9_.$/~@:+-]*$")
