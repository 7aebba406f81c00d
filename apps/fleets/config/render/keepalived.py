"""Pure keepalived.conf renderer: the VRRP side of a node's bundle (no Django, no I/O).

What it guarantees, and why:

- **One VRRP instance per VIP** (a listener's static IP) in the fleet's region, so each VIP moves on
  its own. The virtual router id is derived from the address (`vrid_for`) so it never changes when
  another VIP is added; of two VIPs of one fleet that derive the same id the newer is left out (named in
  a comment) rather than sharing an election or failing every tenant's render; attach refuses it first.
- **Priorities from node order**, first node highest; every instance starts BACKUP with `nopreempt`,
  so a node that comes back does not take its VIPs back (one move per event, no flap-back storm).
- **A node whose HAProxy is down gives its VIPs up, at once**: `track_process` follows the processes
  named like the node's HAProxy binary (its `comm`, what the kernel calls it) through the kernel's
  process-event connector, so a killed HAProxy is seen when it exits, not at the next poll. Losing the
  last one puts every instance in FAULT, which releases the address and tells the peers at once
  (priority-0 advert). It matches the name, not the arguments: a reload re-executes the master with
  `-sf <pids>` inserted right after argv[0], which would break any argument match for a moment and give
  the VIPs away on every push. The name alone cannot tell this node's HAProxy from another one on the
  same host, so a `track_script` running `pgrep -f` on the node's own master socket path stays as well
  (whole-second polls: keepalived 2.2 refuses a shorter `interval`): both must pass. So an unrelated
  HAProxy on the host (or process events that never arrive) only slows the detection back to the poll.
  The connector exists only in the initial network namespace: keepalived must run there (a host's own,
  or started there and moved by `net_namespace`, as tests/netns.py does). Elsewhere keepalived cannot
  subscribe and holds every instance in FAULT, so such a node turns `vrrp_process_events` off and keeps
  only the poll.
- **Not starved on a loaded node**: the VRRP process runs at nice -20 and escalates itself to realtime
  scheduling when a timer fires 100 ms late (`max_auto_priority`), so a busy HAProxy box does not miss
  its 200 ms adverts and hand its VIPs away.
- **Unicast peers** (`unicast_src_ip` + `unicast_peer`, with `check_unicast_src` so an advert from any
  other source is dropped): no multicast assumption.
- **Authentication**: keepalived implements VRRP's PASS authentication only for VRRPv2 (it ignores it,
  with a warning, under VRRPv3, RFC 5798 having removed it). VRRPv2 adverts are whole seconds, so a fleet
  chooses: v3 with sub-second adverts (default; peers restricted by `check_unicast_src`) or v2 with the
  fleet's encrypted secret as `auth_pass` and 1 s steps.
- **No user string reaches the file unchecked**: every value is re-checked here against an allowlist
  (interface names, IP literals, bounded integers, the secret's alphabet) before it is formatted.
  The file carries no revision number, so a route-only change leaves it byte-identical and the node
  takes the change through the runtime API without touching keepalived.
"""

from __future__ import annotations

import ipaddress
import re

from apps.core import validators as v
from apps.core.vrrp import vrid_for
from apps.fleets.config.render.guard import UnsafeValue
from apps.fleets.config.spec import FleetSnapshot, NodeSpec, VrrpSpec

_INTERFACE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,14}$")  # IFNAMSIZ is 16 with the NUL
_AUTH_PASS_RE = re.compile(r"^[A-Za-z0-9]{1,8}$")  # VRRPv2 PASS: at most 8 octets
# A bare command name or an absolute path: it is quoted in the file, so no whitespace, quotes or '\\'.
_BIN_RE = re.compile(r"^(?:[A-Za-z0-9_.+-]+|(?:/[A-Za-z0-9_.+-]+)+)$")
PRIORITY_TOP = 254  # 255 is reserved for the address owner
MAX_PEERS = 64
NO_VIP_ADDRESSES = {"0.0.0.0", "::"}
INDENT = "    "


def node_priority(index: int) -> int:
    """Priority of the node at `index` in the fleet's node order (0 = first = highest)."""
    return max(1, PRIORITY_TOP - index)


def _ip(field: str, value: object) -> str:
    try:
        return v.validate_ip(value)
    except v.InvalidValue as exc:
        raise UnsafeValue(field, exc.code, exc.message) from None


def _int(field: str, value: object, low: int, high: int) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
        raise UnsafeValue(field, "invalid_integer", f"{value!r} is not an integer in {low}..{high}.")
    return value


def check_vrrp(vrrp: VrrpSpec) -> VrrpSpec:
    """A cleaned copy of `vrrp`, or UnsafeValue naming the first value outside its allowlist."""
    if not isinstance(vrrp.interface, str) or not _INTERFACE_RE.match(vrrp.interface):
        raise UnsafeValue("node.vrrp.interface", "invalid_interface",
                          f"{vrrp.interface!r} is not an interface name (letters, digits, '_', '.', '-'; "
                          "at most 15 characters).")
    address = _ip("node.vrrp.address", vrrp.address)
    if not isinstance(vrrp.peers, tuple) or len(vrrp.peers) > MAX_PEERS:
        raise UnsafeValue("node.vrrp.peers", "invalid_type", f"expected a tuple of at most {MAX_PEERS} addresses.")
    peers = tuple(_ip(f"node.vrrp.peers[{i}]", p) for i, p in enumerate(vrrp.peers))
    family = ipaddress.ip_address(address).version
    for i, peer in enumerate(peers):
        if ipaddress.ip_address(peer).version != family or peer == address:
            raise UnsafeValue(f"node.vrrp.peers[{i}]", "invalid_peer",
                              f"{peer} must be another node's address of the same family as {address}.")
    version = _int("node.vrrp.version", vrrp.version, 2, 3)
    advert_ms = _int("node.vrrp.advert_ms", vrrp.advert_ms, 100 if version == 3 else 1000, 40950)
    if version == 2 and advert_ms % 1000:
        raise UnsafeValue("node.vrrp.advert_ms", "invalid_integer",
                          "VRRPv2 adverts are whole seconds: use a multiple of 1000 ms, or VRRPv3.")
    if advert_ms % 10:
        raise UnsafeValue("node.vrrp.advert_ms", "invalid_integer", "VRRPv3 adverts are in steps of 10 ms.")
    auth_pass = vrrp.auth_pass
    if version == 2 and (not isinstance(auth_pass, str) or not _AUTH_PASS_RE.match(auth_pass)):
        raise UnsafeValue("node.vrrp.auth_pass", "invalid_secret",
                          "VRRPv2 needs the fleet's VRRP secret: 1 to 8 letters or digits.")
    for name in ("drained", "process_events"):
        if not isinstance(getattr(vrrp, name), bool):
            raise UnsafeValue(f"node.vrrp.{name}", "invalid_type", "expected a boolean.")
    if (not isinstance(vrrp.haproxy_bin, str) or len(vrrp.haproxy_bin) > 255 or vrrp.haproxy_bin.startswith("-")
            or not _BIN_RE.match(vrrp.haproxy_bin)):
        raise UnsafeValue("node.vrrp.haproxy_bin", "invalid_path",
                          f"{vrrp.haproxy_bin!r} must be a command name or an absolute path of letters, digits, "
                          "'.', '_', '+', '-' and '/'.")
    return VrrpSpec(
        interface=vrrp.interface, address=address,
        priority=_int("node.vrrp.priority", vrrp.priority, 1, PRIORITY_TOP), peers=tuple(sorted(peers)),
        version=version, advert_ms=advert_ms, auth_pass=auth_pass if version == 2 else "",
        drained=vrrp.drained, haproxy_bin=vrrp.haproxy_bin, process_events=vrrp.process_events,
    )


def fleet_vips(snapshot: FleetSnapshot, family: int) -> tuple[list[tuple[int, str]], list[str]]:
    """(vrid, address) of every VIP the snapshot's listeners bind, sorted, and what was left out.

    A shared fleet carries many tenants' VIPs, so one VIP that cannot float here never fails the node's
    render (that would stop every tenant's deploys): of two VIPs deriving one router id the older
    listener's stays, and a VIP of the other IP family than the nodes' is left out. Attaching such an
    address is refused up front (balancers.services), so this is the second line of defence.
    """
    vips: dict[int, str] = {}
    left_out = []
    for ln in sorted(snapshot.listeners, key=lambda x: x.id):
        address = _ip(f"listeners[{ln.lb}.{ln.name}].address", ln.address)
        if address in NO_VIP_ADDRESSES or address in vips.values():
            continue
        if ipaddress.ip_address(address).version != family:
            left_out.append(f"{address} ({ln.lb}.{ln.name}): not of the nodes' IP family")
            continue
        vrid = vrid_for(address)
        if vrid in vips:
            left_out.append(f"{address} ({ln.lb}.{ln.name}): router id {vrid} is taken by {vips[vrid]}")
            continue
        vips[vrid] = address
    return sorted(vips.items()), left_out


def haproxy_comm(haproxy_bin: str) -> str:
    """The kernel's name for processes started from `haproxy_bin` (/proc/PID/comm: the file name, cut
    at 15 characters); a re-executing master keeps it."""
    return haproxy_bin.rsplit("/", 1)[-1][:15]


def _advert_int(vrrp: VrrpSpec) -> str:
    seconds, ms = divmod(vrrp.advert_ms, 1000)
    return str(seconds) if not ms else f"{seconds}.{ms:03d}".rstrip("0")


def render_keepalived(snapshot: FleetSnapshot, node: NodeSpec) -> str | None:
    """keepalived.conf for `node`, or None when the node runs no VRRP. Node and snapshot values must
    have been through guard.check_node/check_snapshot (the caller, render(), does that)."""
    if node.vrrp is None:
        return None
    vrrp = check_vrrp(node.vrrp)
    vips, left_out = fleet_vips(snapshot, ipaddress.ip_address(vrrp.address).version)
    prefix = 32 if ipaddress.ip_address(vrrp.address).version == 4 else 128
    master_socket = f"{node.runtime_dir}/master.sock"
    lines = [
        f"# Spillway: fleet {snapshot.fleet}, node {node.name}. Generated; do not edit.",
        *(f"# VIP left out: {why}" for why in left_out),
        "global_defs {",
        f"{INDENT}router_id {node.name}",
        f"{INDENT}vrrp_version {vrrp.version}",
        f"{INDENT}script_user root",
        f"{INDENT}enable_script_security",
        # Gratuitous ARPs on becoming master, again 1 s later: a neighbour that updated its entry for the
        # VIP less than its locktime (1 s on Linux) before the move ignores the first burst.
        f"{INDENT}vrrp_garp_master_delay 1",
        f"{INDENT}vrrp_garp_master_repeat 3",
        # Adverts every 200 ms on a box whose HAProxy may use every core: a starved VRRP process would
        # let the backups' 3-advert timer expire and move the VIP for nothing.
        f"{INDENT}vrrp_priority -20",
        f"{INDENT}max_auto_priority 50",
        f"{INDENT}min_auto_priority_delay 100000",
        # Every process start and exit on the host is an event; a burst must not overflow the socket
        # (keepalived would then re-scan /proc a second later, a second in which a death goes unseen).
        *([f"{INDENT}process_monitor_rcv_bufs 1048576", f"{INDENT}process_monitor_rcv_bufs_force true"]
          if vrrp.process_events else []),
        "}",
        "",
    ]
    if vrrp.process_events:
        lines += [
            "vrrp_track_process spillway_haproxy_master {",
            f'{INDENT}process "{haproxy_comm(vrrp.haproxy_bin)}"',
            f"{INDENT}quorum 1",
            "}",
            "",
        ]
    lines += [
        "vrrp_script spillway_haproxy {",
        # A killed master leaves its socket file behind, so test for the process that serves it.
        f'{INDENT}script "/usr/bin/pgrep -f -- {master_socket}"',
        f"{INDENT}interval 1",
        f"{INDENT}timeout 1",
        f"{INDENT}fall 1",
        f"{INDENT}rise 2",
        "}",
    ]
    if vrrp.drained:
        lines += ["", "vrrp_script spillway_drained {", f'{INDENT}script "/bin/false"', f"{INDENT}interval 1",
                  f"{INDENT}fall 1", "}"]
    for vrid, address in vips:
        lines += [
            "",
            f"vrrp_instance vip_{vrid} {{",
            f"{INDENT}state BACKUP",
            f"{INDENT}nopreempt",
            f"{INDENT}interface {vrrp.interface}",
            f"{INDENT}virtual_router_id {vrid}",
            f"{INDENT}priority {vrrp.priority}",
            f"{INDENT}advert_int {_advert_int(vrrp)}",
            f"{INDENT}unicast_src_ip {vrrp.address}",
            f"{INDENT}check_unicast_src",
            f"{INDENT}unicast_peer {{",
            *(f"{INDENT * 2}{peer}" for peer in vrrp.peers),
            f"{INDENT}}}",
        ]
        if vrrp.version == 2:
            lines += [f"{INDENT}authentication {{", f"{INDENT * 2}auth_type PASS",
                      f"{INDENT * 2}auth_pass {vrrp.auth_pass}", f"{INDENT}}}"]
        lines += [
            f"{INDENT}virtual_ipaddress {{",
            f"{INDENT * 2}{address}/{prefix} dev {vrrp.interface}",
            f"{INDENT}}}",
            *([f"{INDENT}track_process {{", f"{INDENT * 2}spillway_haproxy_master", f"{INDENT}}}"]
              if vrrp.process_events else []),
            f"{INDENT}track_script {{",
            f"{INDENT * 2}spillway_haproxy",
            *([f"{INDENT * 2}spillway_drained"] if vrrp.drained else []),
            f"{INDENT}}}",
            "}",
        ]
    return "\n".join(lines) + "\n"
