"""global, defaults and backend sections."""

from __future__ import annotations

from apps.fleets.config.render.chain import STICKY_COOKIE, STICKY_DRAINED_MAP, sticky_value
from apps.fleets.config.render.frontends import INDENT, backend_name, format_address
from apps.fleets.config.render.manifest import ManifestBuilder
from apps.fleets.config.spec import MemberSpec, NodeSpec, PoolSpec

# Names validate_bundle() writes into a scratch directory to check a bundle there.
STATS_SOCKET_FILE = "stats.sock"
SERVER_STATE_FILE = "server-state"


def _indent(lines: list[str]) -> list[str]:
    return [lines[0]] + [INDENT + line for line in lines[1:]]


GLOBAL_RUNTIME_LINES = (3, 4)  # global_section's lines naming the node's runtime_dir (the manifest says so)

# The request log every HTTP request sends to Spillway's collector (apps.signals), one UDP datagram per
# request: `format raw` leaves out the syslog header, so a line is exactly these space-separated fields.
# The node's name comes from a process variable set in its global section, so the defaults stay the same
# text on every node. Host is last: it is the only field that can contain a space (a Host header is not
# checked here), and apps.signals.logline splits the rest off first. Bump the version with any change.
SIGNALS_LOG_VERSION = "spw1"
SIGNALS_LOG_FIELDS = ("version", "node", "frontend", "backend", "server", "status", "t_queue", "t_connect",
                      "t_upstream", "t_total", "retries", "termination", "bytes", "path", "host")
SIGNALS_LOG_LEN = 16384
SIGNALS_LOG_FORMAT = (f"{SIGNALS_LOG_VERSION} %[var(proc.node)] %ft %b %s %ST %Tw %Tc %Tr %Ta %rc %tsc %B "
                      "%[var(txn.path)] %[var(txn.host)]")


def global_section(node: NodeSpec) -> list[str]:
    rd = node.runtime_dir
    signals = []
    if node.signals is not None:
        # `len`: HAProxy cuts a longer line. 16 KB holds any request line a default 16 KB buffer accepts, so the
        # host (the last field) is never cut away; the collector counts a cut line all the same (logline.parse).
        signals = [f"log {format_address(*node.signals)} len {SIGNALS_LOG_LEN} format raw local0 info",
                   f"set-var proc.node str({node.signals_tag})"]
    return _indent(
        [
            "global",
            # The node runs `haproxy -W -S <master.sock>`; saying it here too keeps a hand-started
            # `haproxy -f` in master-worker mode so reloads behave the same.
            "master-worker",
            # Maps and certificates are referenced relative to the directory haproxy.cfg is read from:
            # transports write each config set into its own directory and validate it there, so a
            # staged config checks against its own maps, and validate.py checks a scratch copy as is.
            "default-path config",
            f"stats socket {rd}/{STATS_SOCKET_FILE} mode 600 level admin expose-fd listeners",
            f"server-state-file {rd}/{SERVER_STATE_FILE}",
            *signals,
        ]
    )


_COMMON_DEFAULTS = [
    "timeout connect 5s",
    "timeout client 30s",
    "timeout server 30s",
    "timeout queue 10s",
    # Runtime weight/state changes survive a reload when dumped to server-state-file first.
    "load-server-state-from-file global",
    "option redispatch",
    "retries 2",
]


def http_defaults(signals: bool = False) -> list[str]:
    log = ["log global", f'log-format "{SIGNALS_LOG_FORMAT}"'] if signals else []
    return _indent(
        [
            "defaults http",
            "mode http",
            *log,
            *_COMMON_DEFAULTS,
            "timeout http-request 10s",
            "timeout http-keep-alive 10s",
            "timeout tunnel 1h",
            # Measured (HAPROXY.md): 0 client errors across 20 reloads under keep-alive load with this,
            # 38-143 read errors without it.
            "option idle-close-on-response",
            # "safe": a client's first request never rides a connection another client left idle, so a
            # backend that just closed an idle connection cannot fail a first request.
            "http-reuse safe",
            # A request that met a backend's idle-close race (empty response) or a dead server is replayed
            # on another connection or, with redispatch, another server, when HAProxy can replay it.
            "retry-on conn-failure empty-response response-timeout",
        ]
    )


def tcp_defaults() -> list[str]:
    return _indent(["defaults tcp", "mode tcp", *_COMMON_DEFAULTS])


def _server_line(member: MemberSpec, checked: bool, sticky: bool = False) -> str:
    # HAProxy 2.6 has no `drain` keyword on a server line: weight 0 is what "drain" means at runtime
    # (`set server ... state drain` sets the effective weight to 0), and `disabled` is MAINT.
    weight = 0 if member.admin_state == "drain" else member.weight
    line = f"server {member.name} {format_address(member.address, member.port)} weight {weight}"
    if member.admin_state == "maint":
        line += " disabled"
    if sticky:
        line += f" cookie {sticky_value(member)}"
    return line + (" check" if checked else "")


def backend_sections(pool: PoolSpec, protocol: str, manifest: ManifestBuilder) -> list[list[str]]:
    sections = []
    for region in sorted(pool.regions, key=lambda r: r.region):
        name = backend_name(pool.id, region.region, protocol)
        manifest.backends.append(name)
        lines = [f"backend {name}", f"balance {pool.algorithm}"]
        # Server-side idle connections: HAProxy 2.6 has no per-connection idle timeout, but every
        # pool-purge-delay it closes about half of a server's idle connections. 1s (default 5s) keeps
        # few connections idling into typical backend keep-alive timeouts (gunicorn 2s, Node and
        # Apache 5s). A backend closing first is noticed while the connection idles; measured on
        # loopback: 0 failures in 105 requests sent within 5 ms of a backend's idle timeout, and the
        # remaining race is covered by `retry-on empty-response`.
        default_server = "default-server pool-purge-delay 1s"
        if pool.health is not None:
            health = pool.health
            lines += [
                f"option httpchk GET {health.path}",
                f"http-check expect status {health.expected_status}",
            ]
            default_server += f" inter {health.interval_s}s rise {health.rise} fall {health.fall}"
        lines.append(default_server)
        sticky = pool.sticky and protocol == "http"
        if sticky:
            # Persistence never picks a drained member: its cookie is in the drained map (a map entry, so a
            # drain stays a runtime change), and HAProxy's own persistence ignores the drain state.
            lines += [f"cookie {STICKY_COOKIE}{pool.id} insert indirect nocache httponly",
                      f"ignore-persist if {{ req.cook({STICKY_COOKIE}{pool.id}),map_str_int({STICKY_DRAINED_MAP},0) "
                      "-m int 1 }"]
        servers = []
        for member in sorted(region.members, key=lambda m: m.name):
            servers.append((len(lines), name, member.name, member.admin_state, member.weight))
            lines.append(_server_line(member, pool.health is not None, sticky))
        section = _indent(lines)  # one line for one line: the indexes hold
        manifest.server_lines[id(section)] = servers
        sections.append(section)
    return sections
