"""Stage 3 of an HTTP frontend in O(1): the overflow chain read from maps, not one rule set per pool.

Per request, whatever the number of pools (HAPROXY.md, "O(1) overflow decisions"):
- `txn.pool` (integer) -> the chain's first backend, `maps/chain.first.map`. Looked up as a string:
  HAProxy keeps `-m int` patterns (`map_int`) in a list, scanned per request (measured: the last of
  20k pools 6x slower than the first), and string keys in a tree;
- walk at most K steps (K = the longest chain of the listener, i.e. the region count): a step is
  taken while it is usable (`maps/chain.usable.map`, default 1) and this node's request rate to it,
  kept in one stick table keyed by backend name (`chain_rates`), is under its limit
  (`maps/chain.limits.map`); `maps/chain.next.map` gives the next step;
- every step at its limit: `absorb` pools pick a usable step at random in proportion to the
  regions' capacities (`maps/chain.absorb.map` holds each step's cumulative threshold on a 1e6
  scale), `shed` pools (`maps/chain.shed.map`) answer 503 with Retry-After;
- nothing usable: the first step, whose own 503 is the honest answer.

Limits and usability are per node and change at run time (`set map`, no reload): the enforcement
loop (`apps.fleets.enforcement`) sets each node's share of every region about every second from the
demand it observes (`chain_demand`, arrival rate per pool on this node, shed requests included).
The files hold the safe static shares (`traffic.shares.static_limits`), which a reload restores.

Sticky sessions (pools with `session_affinity: cookie`, HTTP): each region backend inserts a cookie named
`spw<pool>` whose value names the member (`m<member id>`), so HAProxy keeps the session on its member. The
frontend reads it before the walk (one rule per sticky pool: `req.cook` takes a fixed name) and sends the
request to the region backend of that member (`maps/sticky.member.map`, only members Spillway rendered)
while that step is usable and its region has room (`maps/chain.room.map`, default 1: the enforcement loop
sets 0 for a region that is drained, dialled to nothing, or over its capacity across the nodes). So a session
that overflowed stays where it landed until its region is full or drained, and one that stayed home stays
home; its requests count in the step's rate like any other, so new sessions fill what is left. A drained
member (admin state drain or maint) is in `maps/sticky.drained.map` and its backend ignores its cookie
(`ignore-persist`): HAProxy's own persistence would still send a session to a server in drain state.

Health per backend cannot come from `nbsrv()` (static names only in 2.6) nor from Lua
(`Proxy.get_srv_act` appeared in 2.8); the usable map is kept from `show stat` by the same loop.
"""

from __future__ import annotations

from collections.abc import Sequence

from apps.fleets.config.render.manifest import ManifestBuilder
from apps.fleets.config.spec import MemberSpec, Owner, PoolSpec


def backend_name(pool_id: int, region: str, protocol: str) -> str:
    # Region slugs never contain "_", so "p1_eu" and "p1_eu_tcp" cannot collide with another pool/region.
    return f"p{pool_id}_{region}" + ("_tcp" if protocol == "tcp" else "")

FIRST_MAP = "maps/chain.first.map"
NEXT_MAP = "maps/chain.next.map"
LIMITS_MAP = "maps/chain.limits.map"
USABLE_MAP = "maps/chain.usable.map"
ABSORB_MAP = "maps/chain.absorb.map"
SHED_MAP = "maps/chain.shed.map"
ROOM_MAP = "maps/chain.room.map"
STICKY_MEMBER_MAP = "maps/sticky.member.map"
STICKY_DRAINED_MAP = "maps/sticky.drained.map"
STICKY_COOKIE = "spw"
# Maps whose values the enforcement loop sets at run time (apps.fleets.enforcement): a rollout or a drift repair
# adds and removes their keys but keeps the live values, which the files' static values would undo for a moment.
ENFORCER_MAPS = frozenset({LIMITS_MAP, USABLE_MAP, ABSORB_MAP, ROOM_MAP})
RATES_TABLE = "chain_rates"
DEMAND_TABLE = "chain_demand"
UNLIMITED = 1_000_000_000  # the limit of an unlimited step (MAX_RATE_PER_NODE)
ABSORB_SCALE = 1_000_000
RETRY_AFTER_S = 1

# (step backend, limit) in chain order, per pool
Chains = dict[int, list[tuple[str, int | None]]]


def chain_files(chains: Chains, pools: dict[int, PoolSpec], manifest: ManifestBuilder) -> dict[str, bytes]:
    """The chain maps for every pool an HTTP frontend of this node serves (each entry: its pool's)."""
    first, nxt, shed = [], [], []
    limits: list[tuple[str, int]] = []
    usable: list[tuple[str, str]] = []
    absorb: list[tuple[str, int]] = []
    owner_of: dict[str, Owner] = {}  # step backend -> its pool
    first_owners, shed_owners = [], []
    room: list[tuple[str, str]] = []
    sticky: list[tuple[str, str, Owner]] = []  # (cookie value, backend, owner)
    for pool_id in sorted(chains):
        steps = chains[pool_id]
        if not steps:
            continue
        if pools[pool_id].sticky:
            for region in pools[pool_id].regions:
                backend = backend_name(pool_id, region.region, "http")
                sticky += [(sticky_value(m), backend, manifest.pool(pool_id)) for m in region.members]
            room += [(backend, "1") for backend, _ in steps]
        # What the config alone knows: a region whose members are all in maint serves nothing. Checks
        # failing at run time are the enforcement loop's to report (from `show stat`).
        serving = {f"{backend_name(pool_id, r.region, 'http')}" for r in pools[pool_id].regions
                   if any(m.admin_state != "maint" for m in r.members)}
        owner = manifest.pool(pool_id)
        first.append((str(pool_id), steps[0][0]))
        first_owners.append(owner)
        for (backend, limit), following in zip(steps, [*steps[1:], None], strict=True):
            owner_of[backend] = owner
            if following is not None:
                nxt.append((backend, following[0]))
            limits.append((backend, UNLIMITED if limit is None else limit))
            usable.append((backend, "1" if backend in serving else "0"))
        pool = pools[pool_id]
        if pool.overload == "shed":
            shed.append((str(pool_id), "1"))
            shed_owners.append(owner)
        else:
            absorb += _absorb_thresholds(steps, pool)
    files = {FIRST_MAP: manifest.map_file(FIRST_MAP, first, first_owners)}
    # A backend can be a step twice (limited, then unlimited as the last resort): sort numbers as numbers.
    for name, entries in ((NEXT_MAP, nxt), (LIMITS_MAP, limits), (USABLE_MAP, usable), (ABSORB_MAP, absorb)):
        written = [(backend, str(value)) for backend, value in sorted(entries)]
        files[name] = manifest.map_file(name, written, [owner_of[backend] for backend, _ in written])
    files[SHED_MAP] = manifest.map_file(SHED_MAP, shed, shed_owners)
    if sticky:  # HAProxy loads a map only where a rule names it: written only with the rules (chain_lines)
        room = sorted(set(room))
        files[ROOM_MAP] = manifest.map_file(ROOM_MAP, room, [owner_of[backend] for backend, _ in room])
        sticky.sort()
        files[STICKY_MEMBER_MAP] = manifest.map_file(STICKY_MEMBER_MAP, [(v, be) for v, be, _ in sticky],
                                                     [o for *_, o in sticky])
    return files


def drained_file(pools: list[PoolSpec], manifest: ManifestBuilder) -> dict[str, bytes]:
    """The drained members of the sticky pools whose HTTP backends this node renders (their `ignore-persist`
    reads it; none: no file, as no rule names it)."""
    rows = sorted((sticky_value(m), "1" if m.admin_state != "active" else "0", manifest.pool(p.id))
                  for p in pools if p.sticky for r in p.regions for m in r.members)
    if not any(p.sticky for p in pools):
        return {}
    return {STICKY_DRAINED_MAP: manifest.map_file(STICKY_DRAINED_MAP, [(v, d) for v, d, _ in rows],
                                                  [o for *_, o in rows])}


def sticky_value(member: MemberSpec) -> str:
    """A member's value in its pool's sticky cookie: its id (unique across pools, says nothing of the fleet)."""
    return f"m{member.id}" if member.id else f"n{member.name}"


def _absorb_thresholds(steps: list[tuple[str, int | None]], pool: PoolSpec) -> list[tuple[str, int]]:
    """Cumulative capacity share of each step on a 1e6 scale (unknown or unlimited: equal weights). The
    enforcement loop replaces them at run time with the pool's steering weights (`shares.absorb_weights`)."""
    caps = dict(pool.capacities)
    return absorb_thresholds([(backend, caps.get(backend.split("_", 1)[1])) for backend, _ in steps])


def absorb_thresholds(weights: list[tuple[str, float | None]]) -> list[tuple[str, int]]:
    """(step backend, weight) in chain order -> (step backend, cumulative share on a 1e6 scale). A step of
    weight 0 gets its predecessor's threshold, so the overload pass never picks it; with an unknown or
    infinite weight, or none positive, the steps share equally."""
    values = [w for _, w in weights]
    if any(w is None or w == float("inf") for w in values) or sum(w or 0 for w in values) <= 0:
        values = [1.0] * len(weights)
    total = sum(values)  # type: ignore[arg-type]
    out, cumulative = [], 0.0
    for (backend, _), weight in zip(weights, values, strict=True):
        cumulative += weight or 0
        out.append((backend, int(cumulative * ABSORB_SCALE // total)))
    if out and values[-1]:
        out[-1] = (out[-1][0], ABSORB_SCALE)  # float residue must not leave the last picks to nothing
    return out


def table_sections(manifest: ManifestBuilder) -> list[list[str]]:
    """The two stick tables the chain reads and writes. A fixed size (entries are allocated only when
    used) keeps the config text unchanged when pools come and go."""
    manifest.backends += [RATES_TABLE, DEMAND_TABLE]
    return [
        ["backend " + RATES_TABLE,
         "    stick-table type string len 64 size 1m expire 10s store http_req_rate(1s)"],
        # The cumulative count lets the enforcer sense a change of demand within its own period (the
        # difference of two readings) rather than after the 1 s sliding rate has caught up. gpc0 counts the
        # pool's shed answers, so a reader need not infer them from arrived minus sent to members (a request
        # between its arrival and its backend at the reading looked shed: a drill failed on one such).
        ["backend " + DEMAND_TABLE,
         "    stick-table type integer size 1m expire 10s store gpc0,http_req_cnt,http_req_rate(1s)"],
    ]


def chain_lines(depth: int, sticky: Sequence[int] = ()) -> list[str]:
    """The frontend's stage 3 for chains of at most `depth` steps (txn.pool set by stage 2); `sticky`: the
    pools with session affinity among the frontend's (module docstring, "Sticky sessions")."""
    if depth <= 0:
        return []
    todo = "!{ var(txn.be) -m found }"
    lines = [
        "# Stage 3, O(1) per request: the pool's chain from maps, rates from a table keyed by backend.",
        f"http-request track-sc1 var(txn.pool) table {DEMAND_TABLE} if {{ var(txn.pool) -m found }}",
        f"http-request set-var(txn.c) var(txn.pool),map({FIRST_MAP}) if {{ var(txn.pool) -m found }}",
    ]
    if sticky:
        lines.append("# Sticky sessions: the region of the member the session's cookie names, while it has room.")
        for pool_id in sorted(sticky):
            cookie = f"{STICKY_COOKIE}{pool_id}"
            lines.append(f"http-request set-var(txn.sbe) req.cook({cookie}),map({STICKY_MEMBER_MAP}) "
                         f"if {{ var(txn.pool) -m int {pool_id} }} {{ req.cook({cookie}) -m found }}")
            # A forged cookie may name another pool's member (the map knows every sticky pool's): never leave
            # the pool the request's route chose.
            lines.append(f"http-request unset-var(txn.sbe) if {{ var(txn.pool) -m int {pool_id} }} "
                         f"{{ var(txn.sbe) -m found }} !{{ var(txn.sbe) -m beg p{pool_id}_ }}")
        lines.append(
            "http-request set-var(txn.be) var(txn.sbe) if { var(txn.sbe) -m found } "
            f"{{ var(txn.sbe),map_str_int({USABLE_MAP},0) -m int 1 }} "
            f"{{ var(txn.sbe),map_str_int({ROOM_MAP},0) -m int 1 }}")
    for _ in range(depth):
        lines += [
            f"http-request set-var(txn.lim) var(txn.c),map_str_int({LIMITS_MAP},{UNLIMITED}) "
            f"if {todo} {{ var(txn.c) -m found }}",
            "http-request set-var(txn.be) var(txn.c) "
            f"if {todo} {{ var(txn.c) -m found }} {{ var(txn.c),map_str_int({USABLE_MAP},1) -m int 1 }} "
            f"{{ var(txn.c),table_http_req_rate({RATES_TABLE}),sub(txn.lim) lt 0 }}",
            f"http-request set-var(txn.c) var(txn.c),map_str({NEXT_MAP}) if {todo} {{ var(txn.c) -m found }}",
        ]
    lines += [
        "# Every step at its share: shed, or absorb in proportion to the regions' capacities.",
        f"http-request sc-inc-gpc0(1) if {todo} {{ var(txn.pool),map_str_int({SHED_MAP},0) -m int 1 }}",
        f"http-request return status 503 content-type text/plain string \"over capacity\\n\" "
        f"hdr Retry-After {RETRY_AFTER_S} if {todo} {{ var(txn.pool),map_str_int({SHED_MAP},0) -m int 1 }}",
        # Absorbed requests are not counted in the steps' rates: the limits meter the planned flow only.
        f"http-request set-var(txn.abs) bool(true) if {todo} {{ var(txn.pool) -m found }}",
        f"http-request set-var(txn.rnd) rand({ABSORB_SCALE}) if {todo} {{ var(txn.pool) -m found }}",
        f"http-request set-var(txn.c) var(txn.pool),map({FIRST_MAP}) if {todo} {{ var(txn.pool) -m found }}",
    ]
    for _ in range(depth):
        lines += [
            "http-request set-var(txn.be) var(txn.c) "
            f"if {todo} {{ var(txn.c) -m found }} {{ var(txn.c),map_str_int({USABLE_MAP},1) -m int 1 }} "
            f"{{ var(txn.c),map_str_int({ABSORB_MAP},0),sub(txn.rnd) gt 0 }}",
            f"http-request set-var(txn.c) var(txn.c),map_str({NEXT_MAP}) if {todo} {{ var(txn.c) -m found }}",
        ]
    lines += [
        "# Nothing usable: the first step answers (503 from a backend without servers).",
        f"http-request set-var(txn.be) var(txn.pool),map({FIRST_MAP}) if {todo} {{ var(txn.pool) -m found }}",
        f"http-request track-sc0 var(txn.be) table {RATES_TABLE} if {{ var(txn.be) -m found }} "
        "!{ var(txn.abs) -m found }",
        "use_backend %[var(txn.be)] if { var(txn.be) -m found }",
    ]
    return lines
