"""validate_bundle (real `haproxy -c -dW`) and bind_conflicts (real sockets and processes)."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from apps.fleets.config.check import (
    bind_conflicts,
    parse_ss_listeners,
    relocate_main,
    remote_bind_conflicts,
    validate_bundle,
    write_bundle,
)
from apps.fleets.config.render import render
from apps.fleets.config.render.frontends import map_bucket, routes_map_name
from apps.fleets.config.spec import ConfigBundle, NodeSpec
from tests.fleets.config.renderkit import NODE, listener, pool, rich_snapshot, route, snapshot
from tests.netutil import pick_free_port

pytestmark = pytest.mark.haproxy


def _with_main(bundle: ConfigBundle, text: str) -> ConfigBundle:
    return ConfigBundle.of({**bundle.files, "haproxy.cfg": text.encode()}, bundle.manifest)


def test_a_rendered_bundle_validates_without_the_nodes_directories() -> None:
    bundle = render(rich_snapshot(), NodeSpec(name="n1", runtime_dir="/nonexistent/spillway/n1"))
    result = validate_bundle(bundle)
    assert result.ok, result.output
    assert "Configuration file is valid" in result.output
    assert result.duration_ms > 0


def test_a_broken_config_fails_and_keeps_the_alert_lines() -> None:
    bundle = render(rich_snapshot(), NODE)
    broken = _with_main(bundle, bundle.main.replace("balance roundrobin", "balance nosuchalgo", 1))
    result = validate_bundle(broken)
    assert not result.ok
    assert "[ALERT]" in result.output and "balance only supports" in result.output


def test_warnings_fail_validation() -> None:
    """-dW: HAProxy only warns about some injected shapes, so a warning must block the push."""
    bundle = render(rich_snapshot(), NODE)
    text = bundle.main.replace(
        "    option forwardfor\n",
        "    option forwardfor\n    use_backend p1_eu\n    http-request deny if { path /x }\n",
        1,
    )
    result = validate_bundle(_with_main(bundle, text))
    assert not result.ok
    assert "[WARNING]" in result.output


def test_a_missing_map_file_is_reported() -> None:
    snap = snapshot((listener(8080, (route(1, 1, "/a", 1), route(2, 2, "/b", 1))),), (pool(1, {"eu": ()}),))
    bundle = render(snap, NODE, route_map_threshold=0)
    missing = routes_map_name("maps/web.http", map_bucket("*"))
    files = {k: v for k, v in bundle.files.items() if k != missing}
    result = validate_bundle(ConfigBundle.of(files, bundle.manifest))
    assert not result.ok and missing in result.output


def test_output_names_the_nodes_paths_not_the_scratch_directory() -> None:
    bundle = render(rich_snapshot(), NODE)
    broken = _with_main(bundle, bundle.main.replace("master-worker", "master-worker\n    bogus-keyword", 1))
    result = validate_bundle(broken)
    assert not result.ok
    assert "spillway-validate-" not in result.output


def test_relocation_touches_only_the_runtime_lines_of_global() -> None:
    rd = "/srv/rt"
    snap = snapshot((listener(8080, (route(1, 1, "/srv/rt/server-state", 1),)),), (pool(1, {"eu": ()}),))
    # Rule form: the route's path is then a literal inside haproxy.cfg itself.
    bundle = render(snap, NodeSpec(name="n1", runtime_dir=rd), route_map_threshold=1_000_000)
    moved = relocate_main(bundle, "/tmp/scratch")
    assert bundle.manifest.runtime_dir == rd
    assert moved.replace("/tmp/scratch/", "/srv/rt/") == bundle.main
    assert "stats socket /tmp/scratch/stats.sock" in moved
    assert "server-state-file /tmp/scratch/server-state" in moved
    assert "{ path_beg /srv/rt/server-state/ }" in moved  # a user value that looks like the path is untouched


def test_missing_haproxy_binary_is_a_failed_validation() -> None:
    result = validate_bundle(render(rich_snapshot(), NODE), haproxy_bin="/nonexistent/haproxy")
    assert not result.ok and "not found" in result.output


def test_write_bundle_keeps_private_keys_private(tmp_path: Path) -> None:
    bundle = render(rich_snapshot(), NODE)
    write_bundle(bundle, tmp_path)
    assert stat.S_IMODE((tmp_path / "certs/example.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "haproxy.cfg").stat().st_mode) == 0o644
    assert (tmp_path / "haproxy.cfg").read_bytes() == bundle.files["haproxy.cfg"]


# --- bind_conflicts -------------------------------------------------------------------------------


def test_a_free_address_is_no_conflict() -> None:
    assert bind_conflicts([("127.0.0.1", pick_free_port())], set()) == []


def test_a_port_held_by_a_stranger_is_a_conflict_even_with_so_reuseport() -> None:
    with socket.socket() as stranger:
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        stranger.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        stranger.bind(("127.0.0.1", 0))
        stranger.listen()
        port = stranger.getsockname()[1]
        assert bind_conflicts([("127.0.0.1", port)], set()) == [("127.0.0.1", port)]
        # A wildcard listener on the same port blocks a specific address too.
        assert bind_conflicts([("0.0.0.0", port)], set()) == [("0.0.0.0", port)]
        # ...unless the holder is one of ours.
        assert bind_conflicts([("127.0.0.1", port)], {os.getpid()}) == []


def test_a_port_held_by_a_child_of_an_owned_process_is_ours() -> None:
    """HAProxy's listeners live in the worker, a child of the master pid the fleet knows."""
    port = pick_free_port()
    code = (
        "import socket,sys,time\n"
        f"s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); print('up',flush=True); time.sleep(30)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess,sys; p=subprocess.Popen([sys.executable,'-c',{code!r}]); p.wait()"],
        stdout=subprocess.PIPE,
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == b"up"
        assert bind_conflicts([("127.0.0.1", port)], {parent.pid}) == []
        assert bind_conflicts([("127.0.0.1", port)], {os.getpid() + 10_000_000}) == [("127.0.0.1", port)]
    finally:
        children = Path(f"/proc/{parent.pid}/task/{parent.pid}/children").read_text().split()
        for pid in children:
            os.kill(int(pid), 15)
        parent.wait(timeout=5)


def test_descendants_are_found_by_walking_down_including_children_a_thread_started(monkeypatch) -> None:
    """The walk reads each process's own children lists (one per thread: a child is listed under the thread that
    forked it), not every process's stat; it finds what the scan of all /proc finds."""
    from apps.fleets.config import check

    code = (
        "import subprocess,sys,threading\n"
        "kids,started,done=[],threading.Event(),threading.Event()\n"
        "def fork(): kids.append(subprocess.Popen(['sleep','30'])); started.set(); done.wait()\n"
        "t=threading.Thread(target=fork); t.start(); started.wait()\n"  # the thread lives on: its list holds it
        "kids.append(subprocess.Popen(['sleep','30']))\n"
        "print(' '.join(str(k.pid) for k in kids),flush=True); sys.stdin.read()\n"
        "[k.kill() for k in kids]; done.set()\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        assert parent.stdout is not None
        kids = {int(pid) for pid in parent.stdout.readline().split()}
        assert len(kids) == 2
        assert check._CHILDREN_LISTED
        found = check.descendants({parent.pid})
        monkeypatch.setattr(check, "_CHILDREN_LISTED", False)  # a kernel without the lists: every stat is read
        assert found == {parent.pid, *kids} == check.descendants({parent.pid})
    finally:
        parent.communicate(b"", timeout=10)


def test_a_round_of_checks_reads_the_hosts_sockets_once_and_confirms_a_conflict_afresh() -> None:
    """A rollout's pre-checks share one read of the host's sockets (HostListeners); a listener that has gone since
    that read is no conflict, one still there is."""
    from apps.fleets.config.check import HostListeners

    with socket.socket() as gone, socket.socket() as staying:
        for stranger in (gone, staying):
            stranger.bind(("127.0.0.1", 0))
            stranger.listen()
        ports = gone.getsockname()[1], staying.getsockname()[1]
        host = HostListeners()
        assert bind_conflicts([("127.0.0.1", port) for port in ports], set(), host) == [
            ("127.0.0.1", port) for port in sorted(ports)]
        table = host.table()
        gone.close()
        assert host.table() is table  # the round's read, kept
        assert bind_conflicts([("127.0.0.1", port) for port in ports], set(), host) == [("127.0.0.1", ports[1])]


def _leave_time_wait(reuse_address: bool) -> int:
    """A port whose server closed a connection first: a TIME_WAIT socket stays on that port."""
    with socket.socket() as server:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(reuse_address))
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = server.accept()
        conn.close()
        client.close()
    return port


def test_time_wait_of_a_well_behaved_server_is_not_a_conflict() -> None:
    assert bind_conflicts([("127.0.0.1", _leave_time_wait(reuse_address=True))], set()) == []


def test_time_wait_that_blocks_haproxy_is_reported() -> None:
    """Measured: HAProxy 2.6 itself fails to bind ("Address already in use") over such a TIME_WAIT."""
    port = _leave_time_wait(reuse_address=False)
    assert bind_conflicts([("127.0.0.1", port)], set()) == [("127.0.0.1", port)]


def test_a_bound_but_not_listening_socket_is_a_conflict() -> None:
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        port = squatter.getsockname()[1]
        assert bind_conflicts([("127.0.0.1", port)], set()) == [("127.0.0.1", port)]


SS_OUTPUT = """LISTEN 0      4096   127.0.73.1:8080  0.0.0.0:* users:(("haproxy",pid=500,fd=7),("haproxy",pid=501,fd=7))
LISTEN 0      511    127.0.0.1:6379  0.0.0.0:* users:(("redis-server",pid=77,fd=6))
LISTEN 0      128    *:9000          *:*       users:(("stranger",pid=88,fd=3))
LISTEN 0      128    [::1]:7000      [::]:*
LISTEN 0      128    127.0.0.53%lo:53 0.0.0.0:* users:(("resolved",pid=9,fd=1))
"""


def test_ss_listeners_are_parsed_with_their_holders() -> None:
    listeners = parse_ss_listeners(SS_OUTPUT)
    assert ("127.0.73.1", 8080, frozenset({500, 501})) in listeners
    assert ("0.0.0.0", 9000, frozenset({88})) in listeners
    assert ("::1", 7000, frozenset()) in listeners
    assert ("127.0.0.53", 53, frozenset({9})) in listeners


def test_remote_bind_conflicts_spare_the_nodes_own_haproxy_and_flag_strangers() -> None:
    listeners = parse_ss_listeners(SS_OUTPUT)
    wanted = [("127.0.73.1", 8080), ("127.0.0.1", 6379), ("127.0.73.1", 9000), ("::1", 7000), ("127.0.73.1", 81)]
    conflicts = remote_bind_conflicts(wanted, listeners, owned_by_pids={500, 501, 499})
    # Own HAProxy: fine. Redis and a wildcard stranger: conflicts. A holder ss cannot name: conflict.
    assert conflicts == [("127.0.0.1", 6379), ("127.0.73.1", 9000), ("::1", 7000)]
    assert ("127.0.73.1", 8080) in remote_bind_conflicts(wanted, listeners, owned_by_pids=set())
