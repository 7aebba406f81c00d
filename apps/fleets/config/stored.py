"""FleetSnapshot <-> JSON, and the revision-independent content hash of a bundle (no Django).

A ConfigRevision stores the snapshot it was rendered from, so any node (also one added later) can be
rendered for any revision: rollback to an earlier revision and drift checks need exactly that.
Certificate PEMs hold private keys, so they are stored only through the `seal` / `unseal` callables
the caller passes (apps.core.crypto in production).
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from apps.fleets.config.digest import set_digest
from apps.fleets.config.render import HEADER_LINES
from apps.fleets.config.spec import (
    MAIN_FILE,
    CertSpec,
    ConfigBundle,
    FleetSnapshot,
    HealthCheckSpec,
    ListenerSpec,
    MemberSpec,
    Owner,
    PoolRegionSpec,
    PoolSpec,
    RegionStep,
    RouteSpec,
    RouteTargetSpec,
)

Seal = Callable[[str], str]


def route_to_json(r: RouteSpec) -> dict[str, Any]:
    return {"id": r.id, "priority": r.priority, "hosts": list(r.hosts), "path_match": r.path_match,
            "path": r.path, "targets": [[t.pool_id, t.weight] for t in r.targets],
            "redirect_url": r.redirect_url}


def route_from_json(r: dict[str, Any]) -> RouteSpec:
    return RouteSpec(
        id=r["id"], priority=r["priority"], hosts=tuple(r["hosts"]), path_match=r["path_match"],
        path=r["path"], targets=tuple(RouteTargetSpec(pool_id=t[0], weight=t[1]) for t in r["targets"]),
        redirect_url=r.get("redirect_url"),
    )


def route_order(route: RouteSpec) -> tuple[int, int]:
    """How a snapshot lists a listener's routes (queries.fleet_snapshot reads them in this order)."""
    return route.priority, route.id


def lane_delta_to_json(revision: int, changes: dict[int, tuple[list[RouteSpec], list[int]]]) -> dict[str, Any]:
    """A route-lane revision's stored snapshot: {listener id: (routes set, route ids removed)}."""
    return {"lane": {"revision": revision, "listeners": {
        str(ln): {"set": [route_to_json(r) for r in upserts], "del": sorted(deletes)}
        for ln, (upserts, deletes) in changes.items()}}}


def apply_lane_delta(snap: FleetSnapshot, stored: dict[str, Any]) -> FleetSnapshot:
    """The snapshot of a route-lane revision: its base's `snap` with the stored route changes applied."""
    lane = stored["lane"]
    listeners = []
    for ln in snap.listeners:
        change = lane["listeners"].get(str(ln.id))
        if change is None:
            listeners.append(ln)
            continue
        routes = {r.id: r for r in ln.routes}
        for route_id in change["del"]:
            routes.pop(route_id, None)
        for data in change["set"]:
            route = route_from_json(data)
            routes[route.id] = route
        listeners.append(replace(ln, routes=tuple(sorted(routes.values(), key=route_order))))
    return replace(snap, revision=lane["revision"], listeners=tuple(listeners))


def snapshot_to_json(snap: FleetSnapshot, seal: Seal) -> dict[str, Any]:
    def member(m: MemberSpec) -> dict[str, Any]:
        return {"name": m.name, "address": m.address, "port": m.port, "weight": m.weight,
                "admin_state": m.admin_state}

    def pool(p: PoolSpec) -> dict[str, Any]:
        health = None
        if p.health is not None:
            health = {"path": p.health.path, "interval_s": p.health.interval_s, "rise": p.health.rise,
                      "fall": p.health.fall, "expected_status": p.health.expected_status}
        return {
            "id": p.id, "name": p.name, "algorithm": p.algorithm, "health": health,
            "regions": [{"region": r.region, "members": [member(m) for m in r.members]} for r in p.regions],
            "chain": [[s.region, s.rate_limit_per_node] for s in p.chain],
            "overload": p.overload, "capacities": [list(c) for c in p.capacities],
        }

    route = route_to_json

    def listener(ln: ListenerSpec) -> dict[str, Any]:
        cert = None
        if ln.cert is not None:
            cert = {"name": ln.cert.name, "pem_sealed": seal(ln.cert.pem.decode())}
        return {"id": ln.id, "lb": ln.lb, "name": ln.name, "protocol": ln.protocol, "address": ln.address,
                "port": ln.port, "default_pool_id": ln.default_pool_id,
                "routes": [route(r) for r in ln.routes], "cert": cert,
                "no_route_status": ln.no_route_status, "no_route_body": ln.no_route_body}

    return {
        "fleet": snap.fleet, "region": snap.region, "revision": snap.revision,
        "listeners": [listener(ln) for ln in snap.listeners], "pools": [pool(p) for p in snap.pools],
    }


def snapshot_from_json(data: dict[str, Any], unseal: Seal) -> FleetSnapshot:
    def pool(p: dict[str, Any]) -> PoolSpec:
        health = p.get("health")
        return PoolSpec(
            id=p["id"], name=p["name"], algorithm=p["algorithm"],
            health=None if health is None else HealthCheckSpec(**health),
            regions=tuple(
                PoolRegionSpec(region=r["region"], members=tuple(MemberSpec(**m) for m in r["members"]))
                for r in p["regions"]
            ),
            chain=tuple(RegionStep(region=s[0], rate_limit_per_node=s[1]) for s in p["chain"]),
            overload=p.get("overload", "absorb"),
            capacities=tuple((c[0], c[1]) for c in p.get("capacities", ())),
        )

    route = route_from_json

    def listener(ln: dict[str, Any]) -> ListenerSpec:
        cert = ln.get("cert")
        return ListenerSpec(
            id=ln["id"], lb=ln["lb"], name=ln["name"], protocol=ln["protocol"], address=ln["address"],
            port=ln["port"], default_pool_id=ln.get("default_pool_id"),
            routes=tuple(route(r) for r in ln["routes"]),
            cert=None
            if cert is None
            else CertSpec(name=cert["name"], pem=unseal(cert["pem_sealed"]).encode()),
            # Revisions stored before the no-route answer existed: the default (404).
            **{k: ln[k] for k in ("no_route_status", "no_route_body") if k in ln},
        )

    return FleetSnapshot(
        fleet=data["fleet"], region=data["region"], revision=data["revision"],
        listeners=tuple(listener(ln) for ln in data["listeners"]),
        pools=tuple(pool(p) for p in data["pools"]),
    )


def strip_header(text: str) -> str:
    """A stored revision's haproxy.cfg (or display text) without the renderer's header comment, which
    names the revision and node: the first HEADER_LINES lines the renderer always writes (a stored
    text has no manifest; a bundle's own is `ConfigBundle.body`)."""
    parts = text.split("\n", HEADER_LINES)
    return parts[HEADER_LINES] if len(parts) > HEADER_LINES else ""


def revision_diff(old_text: str, new_text: str, old_label: str, new_label: str) -> str:
    """Unified diff of two display texts below their headers (which only name revision and node)."""
    a = strip_header(old_text).splitlines(keepends=True)
    b = strip_header(new_text).splitlines(keepends=True)
    return "".join(_unified_diff(a, b, old_label, new_label, n=3))


_SECTION_TITLE = "# ---- "  # display_text's title line before each map file


def _opcodes(a: list[str], b: list[str]) -> list[tuple[str, int, int, int, int]]:
    """difflib opcodes for two nearly equal texts, matched one display section (haproxy.cfg, then each
    map) at a time and only between the lines each section shares at its start and end.

    A route change at 100k routes moves a few lines of ~200k; matching the whole texts at once took
    ~0.5 s per revision. Where the two texts do not list the same sections, one section is the whole.
    """
    def cuts(lines: list[str]) -> list[int]:
        return [0, *(i for i, line in enumerate(lines) if line.startswith(_SECTION_TITLE)), len(lines)]

    ca, cb = cuts(a), cuts(b)
    if [a[i] for i in ca[1:-1]] != [b[i] for i in cb[1:-1]]:
        ca, cb = [0, len(a)], [0, len(b)]
    ops: list[tuple[str, int, int, int, int]] = []

    def add(tag: str, i1: int, i2: int, j1: int, j2: int) -> None:
        if i1 == i2 and j1 == j2:
            return
        if tag == "equal" and ops and ops[-1][0] == "equal":
            ops[-1] = ("equal", ops[-1][1], i2, ops[-1][3], j2)
        else:
            ops.append((tag, i1, i2, j1, j2))

    for (a1, a2), (b1, b2) in zip(itertools.pairwise(ca), itertools.pairwise(cb), strict=True):
        head = 0
        while a1 + head < a2 and b1 + head < b2 and a[a1 + head] == b[b1 + head]:
            head += 1
        tail = 0
        while a2 - tail > a1 + head and b2 - tail > b1 + head and a[a2 - tail - 1] == b[b2 - tail - 1]:
            tail += 1
        add("equal", a1, a1 + head, b1, b1 + head)
        i0, j0 = a1 + head, b1 + head
        matcher = difflib.SequenceMatcher(None, a[i0:a2 - tail], b[j0:b2 - tail])
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            add(tag, i0 + i1, i0 + i2, j0 + j1, j0 + j2)
        add("equal", a2 - tail, a2, b2 - tail, b2)
    return ops


def _range(start: int, stop: int) -> str:
    """A unified diff hunk's range, as difflib writes it."""
    beginning, length = start + 1, stop - start
    if length == 1:
        return f"{beginning}"
    if not length:
        beginning -= 1
    return f"{beginning},{length}"


def _unified_diff(a: list[str], b: list[str], fromfile: str, tofile: str, n: int = 3) -> list[str]:
    """difflib.unified_diff's format over _opcodes."""
    matcher = difflib.SequenceMatcher(None, [], [])
    matcher.opcodes = _opcodes(a, b)  # get_grouped_opcodes groups these with n lines of context
    out: list[str] = []
    for group in matcher.get_grouped_opcodes(n):
        if not out:
            out += [f"--- {fromfile}\n", f"+++ {tofile}\n"]
        first, last = group[0], group[-1]
        out.append(f"@@ -{_range(first[1], last[2])} +{_range(first[3], last[4])} @@\n")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                out += [" " + line for line in a[i1:i2]]
                continue
            if tag in ("replace", "delete"):
                out += ["-" + line for line in a[i1:i2]]
            if tag in ("replace", "insert"):
                out += ["+" + line for line in b[j1:j2]]
    return out


def content_sha256(bundle: ConfigBundle) -> str:
    """Hash of what a bundle makes HAProxy do: every file, haproxy.cfg without its header.

    Two renders of the same desired state for the same node hash the same whatever revision
    number they carry, so an unchanged state makes no new revision.
    """
    files = dict(bundle.files)
    files[MAIN_FILE] = bundle.body.encode()
    return set_digest(files)


def _shown_maps(bundle: ConfigBundle) -> list[str]:
    return [name for name in bundle.files if name != MAIN_FILE and not bundle.is_secret(name)]


def display_text(bundle: ConfigBundle) -> str:
    """haproxy.cfg followed by the bundle's map files, for people and diffs; never the certificates."""
    parts = [bundle.main]
    for name in _shown_maps(bundle):
        parts.append(f"\n# ---- {name} ----\n{bundle.files[name].decode(errors='replace')}")
    return "".join(parts)


def display_lines(bundle: ConfigBundle) -> tuple[list[str], list[Owner | None]]:
    """display_text's lines below the header and, from the render manifest, the owner of each."""
    facts = bundle.rendered_manifest
    owners: list[Owner | None] = list(facts.main_owners)
    for name in _shown_maps(bundle):
        # A blank line and the `# ---- name ----` title, then the entries (a non-map file: nobody's lines).
        entries = facts.map_owners.get(name)
        owners += [None, None]
        owners += entries if entries is not None else [None] * bundle.files[name].count(b"\n")
    lines = strip_header(display_text(bundle)).splitlines()
    if len(lines) != len(owners):  # a renderer change that broke the manifest must not mislabel lines
        raise ValueError(f"render manifest names {len(owners)} lines, the text has {len(lines)}")
    return lines, owners


def diff_lines(diff: str) -> list[tuple[str, str]]:
    """(css class, line) for a unified diff: the template colours additions and deletions."""
    lines = []
    for line in diff.splitlines():
        if line.startswith(("+++", "---")):
            cls = "meta"
        elif line.startswith("+"):
            cls = "add"
        elif line.startswith("-"):
            cls = "del"
        else:
            cls = ""
        lines.append((cls, line))
    return lines
