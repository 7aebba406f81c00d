"""HAProxy runtime API and master CLI clients against real HAProxy 2.6 processes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from apps.fleets.node.runtime_api import (
    HAProxySocket,
    MasterSocket,
    RuntimeApiError,
    RuntimeUnavailable,
    parse_show_proc,
)
from apps.fleets.node.showstat import parse_backends, parse_show_stat
from tests.haproxykit import HAProxyNodeFactory, pool_config
from tests.netutil import http_get

pytestmark = pytest.mark.haproxy

SHOW_PROC_AFTER_FAILED_RELOAD = """#<PID>          <type>          <reloads>       <uptime>        <version>
9588            master          2 [failed: 1]   0d00h00m03s     2.6.12-1+deb12u4
# workers
9600            worker          1               0d00h00m02s     2.6.12-1+deb12u4
# programs

"""


def test_show_proc_parser_reads_the_failed_counter_and_workers() -> None:
    info = parse_show_proc(SHOW_PROC_AFTER_FAILED_RELOAD)
    assert (info.master_pid, info.master_reloads, info.failed_reloads) == (9588, 2, 1)
    assert [(w.pid, w.reloads) for w in info.workers] == [(9600, 1)]
    assert info.current_worker is not None and info.current_worker.pid == 9600


@pytest.fixture
def two_backend_node(haproxy_node: HAProxyNodeFactory, tiny_backend, free_port):
    b1, b2 = tiny_backend("b1"), tiny_backend("b2")
    port = free_port()
    node, _proc = haproxy_node(pool_config(port, b1, b2))
    return node, port, b1, b2


def test_show_stat_lists_servers_with_status_and_weight(two_backend_node) -> None:
    node, port, _b1, _b2 = two_backend_node
    for _ in range(4):
        assert http_get(f"http://127.0.0.1:{port}/")[0] == 200
    rows = {(r.pxname, r.svname): r for r in HAProxySocket(node.stats_socket_path).show_stat()}
    assert rows[("pool", "b1")].status == "no check"
    assert rows[("pool", "b1")].weight == 10
    assert rows[("pool", "b1")].is_server
    assert rows[("fe", "FRONTEND")].req_tot == 4
    assert rows[("pool", "b1")].raw["addr"].startswith("127.0.0.1:")


def test_drain_and_weight_take_effect_without_reload(two_backend_node) -> None:
    node, port, b1, _b2 = two_backend_node
    stats = HAProxySocket(node.stats_socket_path)
    workers_before = [(w.pid, w.reloads) for w in MasterSocket(node.master_socket_path).show_proc().workers]

    stats.set_server_state("pool", "b1", "drain")
    stats.set_server_weight("pool", "b2", 20)

    rows = {r.svname: r for r in stats.show_stat() if r.pxname == "pool"}
    assert rows["b1"].status == "DRAIN"
    assert rows["b2"].weight == 20
    hits_b1 = b1.hits
    bodies = [http_get(f"http://127.0.0.1:{port}/")[1] for _ in range(10)]
    assert bodies == ["b2"] * 10
    assert b1.hits == hits_b1
    # Same worker, no reload (its uptime string moves on with the clock).
    assert [(w.pid, w.reloads) for w in MasterSocket(node.master_socket_path).show_proc().workers] == workers_before

    stats.set_server_state("pool", "b1", "ready")
    assert {http_get(f"http://127.0.0.1:{port}/")[1] for _ in range(6)} == {"b1", "b2"}


def test_haproxy_refusals_raise_with_haproxys_text(two_backend_node) -> None:
    node, _port, _b1, _b2 = two_backend_node
    stats = HAProxySocket(node.stats_socket_path)
    with pytest.raises(RuntimeApiError, match="No such server"):
        stats.set_server_state("pool", "nope", "drain")
    with pytest.raises(ValueError, match="invalid HAProxy server name"):
        stats.set_server_state("pool", "b1\nshutdown sessions", "drain")
    with pytest.raises(ValueError):
        stats.set_server_weight("pool", "b1", 999)
    # A map the worker does not load is a refusal, not an entry 'map' -> 'identifier. ...' (what a
    # reload then copied into the new worker's challenge map).
    with pytest.raises(RuntimeApiError, match="Unknown map"):
        stats.show_map("maps/not-loaded.map")


def test_dump_server_state_writes_a_loadable_file_atomically(two_backend_node, tmp_path: Path) -> None:
    node, _port, _b1, _b2 = two_backend_node
    stats = HAProxySocket(node.stats_socket_path)
    stats.set_server_state("pool", "b1", "maint")
    (tmp_path / "dump").mkdir()
    target = tmp_path / "dump" / "state"
    stats.dump_server_state(str(target))
    lines = target.read_text().splitlines()
    assert lines[0] == "1"
    b1_line = next(line.split() for line in lines if " pool " in line and " b1 " in line)
    assert b1_line[6] != "0"  # srv_admin_state: maint flag set
    assert [p.name for p in target.parent.iterdir()] == ["state"]  # no temp file left behind


def test_show_info_reports_the_version(two_backend_node) -> None:
    node, *_ = two_backend_node
    assert HAProxySocket(node.stats_socket_path).show_info()["Version"].startswith("2.")


def test_a_missing_socket_is_reported_clearly(tmp_path: Path) -> None:
    with pytest.raises(RuntimeUnavailable, match="does not exist"):
        HAProxySocket(str(tmp_path / "nope.sock")).show_stat()


def _serving(port: int, path: str = "/") -> str:
    return http_get(f"http://127.0.0.1:{port}{path}")[1]


def _text_config(port: int, text: str) -> str:
    return f"""
frontend fe
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string {text}
"""


def _pid_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            return True
        time.sleep(0.02)
    return False


def test_reload_and_verify_reports_the_new_worker_and_the_old_one_exits(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    port = free_port()
    node, _proc = haproxy_node(_text_config(port, "v1"))
    assert _serving(port) == "v1"
    # Edit the live file in place: this test is about the master, not about pushes.
    live = Path(node.config_path)
    live.write_text(live.read_text().replace("string v1", "string v2"))

    result = MasterSocket(node.master_socket_path).reload_and_verify(timeout_s=10)

    assert result.ok, result.error
    assert result.new_worker_pid not in result.old_worker_pids
    assert _serving(port) == "v2"
    assert all(_pid_gone(pid, 3.0) for pid in result.old_worker_pids)
    assert result.duration_ms < 2000


def test_reload_of_a_broken_config_is_reported_as_failed_and_the_old_worker_serves(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    port = free_port()
    node, _proc = haproxy_node(_text_config(port, "v1"))
    live = Path(node.config_path)
    live.write_text(live.read_text() + "\n    no_such_keyword here\n")
    master = MasterSocket(node.master_socket_path)

    result = master.reload_and_verify(timeout_s=10)

    assert not result.ok
    assert "failed: 1" in (result.error or "")
    assert result.new_worker_pid is None
    assert [w.pid for w in master.show_proc().workers] == result.old_worker_pids
    assert _serving(port) == "v1"


def _answers_from_map(haproxy_node: HAProxyNodeFactory, port: int, routes_map: bytes):  # type: ignore[no-untyped-def]
    """A node answering each request with what maps/r.map gives its path (map_beg), or `none`."""
    node, _proc = haproxy_node(
        f"""
frontend fe
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain lf-string "%[path,map_beg(maps/r.map,none)]"
""",
        files={"maps/r.map": routes_map},
    )
    return node


def test_replace_map_swaps_a_large_map_without_a_reload(haproxy_node: HAProxyNodeFactory, free_port) -> None:
    """3,000 entries (several 8 kB payloads) replace a map's content in one commit; the worker stays."""
    port = free_port()
    node = _answers_from_map(haproxy_node, port, b"/a first\n")
    master = MasterSocket(node.master_socket_path)
    worker = master.show_proc().current_worker.pid
    stats = HAProxySocket(node.stats_socket_path)
    entries = [(f"/k{i}", f"value-{i}") for i in range(3000)] + [("/a", "second"), ("/a/b", "third")]

    stats.replace_map("maps/r.map", entries)

    assert sorted(stats.show_map("maps/r.map")) == sorted(entries)
    assert _serving(port, "/a/x") == "second" and _serving(port, "/a/b/c") == "third"
    assert _serving(port, "/k2999") == "value-2999"
    assert master.show_proc().current_worker.pid == worker
    with pytest.raises(ValueError):
        stats.replace_map("maps/r.map", [("/bad key", "v")])
    with pytest.raises(ValueError):
        stats.replace_map("/etc/passwd", entries)
    with pytest.raises(RuntimeApiError):
        stats.replace_map("maps/not-loaded.map", entries)
    assert _serving(port, "/a/x") == "second", "a refused update leaves the live map as it was"


def test_a_map_delta_and_its_read_back_go_over_few_connections_and_hostile_characters_stay_data(
        haproxy_node: HAProxyNodeFactory, free_port, monkeypatch) -> None:
    """apply_map_delta sends its `add/set/del map` and `get map` commands `;`-separated, a few kB a connection:
    600 moved keys (several batches) land and read back; a value holding `;` or `\\` is that value, never a
    second command; a key that cannot be set is reported, not taken for done."""
    from apps.fleets.node.mapdelta import MapDelta
    from apps.fleets.node.runtime_api import RuntimeApiError

    port = free_port()
    node = _answers_from_map(haproxy_node, port, b"/old gone\n/keep kept\n/change before\n")
    stats = HAProxySocket(node.stats_socket_path)
    connections = []
    send = stats._send
    monkeypatch.setattr(stats, "_send",
                        lambda command, timeout: connections.append(command) or send(command, timeout))
    added = (*((f"/k{i}", f"value-{i}") for i in range(600)),
             ("/semi", "https://r.test/a?x=1;help"), ("/slash", "a\\;b\\\\c"))
    stats.apply_map_delta("maps/r.map", MapDelta(added=added, changed=(("/change", "after"),), removed=("/old",)))

    assert 2 <= len(connections) <= 12, len(connections)  # 1,206 commands
    live = dict(stats.show_map("maps/r.map"))
    assert live["/semi"] == "https://r.test/a?x=1;help" and live["/keep"] == "kept"
    assert live["/slash"] == "a\\;b\\\\c" and live["/change"] == "after" and "/old" not in live
    assert all(live[key] == value for key, value in added)
    _status, body = http_get(f"http://127.0.0.1:{port}/semi")
    assert body.strip() == "https://r.test/a?x=1;help"

    with pytest.raises(RuntimeApiError, match="not found"):
        stats.apply_map_delta("maps/r.map", MapDelta(changed=(("/never-added", "x"),)))


def test_a_key_added_that_is_live_already_answers_the_new_value(haproxy_node: HAProxyNodeFactory, free_port) -> None:
    """A worker killed in the middle of applying a delta leaves keys live that the node's record does not know of;
    the successor adds them again. Added on top, the older entry kept answering (and the drift check then found
    "duplicate keys live": bench-chaos, both workers of a fleet shard killed)."""
    from apps.fleets.node.mapdelta import MapDelta

    port = free_port()
    node = _answers_from_map(haproxy_node, port, b"/keep kept\n")
    stats = HAProxySocket(node.stats_socket_path)
    stats.command("add map maps/r.map /new older")  # what the killed worker took

    stats.apply_map_delta("maps/r.map", MapDelta(added=(("/new", "newer"), ("/other", "fresh"))))

    live = stats.show_map("maps/r.map")
    assert [value for key, value in live if key == "/new"] in (["newer"], ["newer", "newer"])
    _status, body = http_get(f"http://127.0.0.1:{port}/new")
    assert body.strip() == "newer"
    assert dict(live)["/other"] == "fresh"


def test_show_stat_rows_are_read_by_header_name_whatever_the_quoting(haproxy_node: HAProxyNodeFactory,
                                                                     free_port, tiny_backend) -> None:
    """parse_show_stat splits an unquoted line on commas and hands a quoted one (a check's text holding a comma
    or a quote) to the csv module: each row's columns are what csv reads, by header name, on a real worker's
    answer and on a line HAProxy quotes."""
    import csv

    port = free_port()
    node, _ = haproxy_node(pool_config(port, tiny_backend("a"), tiny_backend("b")))
    text = HAProxySocket(node.stats_socket_path).command("show stat")
    header = text.splitlines()[0][2:].split(",")
    rows = parse_show_stat(text)
    by_csv = list(csv.reader(line for line in text.splitlines()[1:] if line.strip()))
    assert len(rows) == len(by_csv) >= 3
    for row, values in zip(rows, by_csv, strict=True):
        assert dict(row.raw) == dict(zip(header, values, strict=False))
        assert (row.pxname, row.svname, row.status) == (values[0], values[1], values[header.index("status")])

    quoted = values[:]
    quoted[header.index("last_chk")] = 'Layer4 connection problem, info: "Connection refused"'
    line = ",".join(f'"{v.replace(chr(34), chr(34) * 2)}"' if ("," in v or '"' in v) else v for v in quoted)
    (row,) = parse_show_stat(text.splitlines()[0] + "\n" + line + "\n")
    assert row.raw["last_chk"] == 'Layer4 connection problem, info: "Connection refused"'
    assert (row.pxname, row.svname, row.type) == (values[0], values[1], int(values[header.index("type")]))
    assert row.raw.get("no_such_column") is None and "no_such_column" not in row.raw
    assert len(row.raw) == len(list(row.raw)) == len(header)


def test_backend_usable_read_from_the_backends_rows_alone(haproxy_node: HAProxyNodeFactory, free_port,
                                                          tiny_backend) -> None:
    """The enforcement loop asks for `show stat -1 2 -1` and splits off only the columns it needs: a backend is
    usable where the whole `show stat` has it UP with a server taking requests. An emptied (maint) or drained
    backend is not, nor one without servers, which HAProxy itself reports UP. A quoted line is read whole."""
    port = free_port()
    cfg = pool_config(port, tiny_backend("a")) + f"""
backend emptied
    server gone {tiny_backend("b").server_line_addr}

backend drained
    server leaving {tiny_backend("c").server_line_addr}

backend empty
"""
    node, _ = haproxy_node(cfg)
    stats = HAProxySocket(node.stats_socket_path)
    stats.set_server_state("emptied", "gone", "maint")
    stats.set_server_state("drained", "leaving", "drain")
    backends_only = stats.command("show stat -1 2 -1")
    assert "FRONTEND" not in backends_only and ",gone," not in backends_only

    usable, active = parse_backends(backends_only)
    assert usable == {"pool": True, "emptied": False, "drained": False, "empty": False}
    # What the loop reads in the same pass: the usable active servers' counts.
    assert active == {"pool": 1, "emptied": 0, "drained": 0, "empty": 0}
    rows = parse_show_stat(stats.command("show stat"))
    status = {r.pxname: r.status for r in rows if r.svname == "BACKEND"}
    assert status["empty"] == "UP"  # HAProxy's own word for a backend without servers
    serving = {r.pxname for r in rows if r.is_server and (r.status.startswith("UP") or r.status == "no check")}
    assert usable == {be: status[be] == "UP" and be in serving for be in status}

    header, row = backends_only.splitlines()[0], next(x for x in backends_only.splitlines() if x.startswith("pool,"))
    quoted = row.split(",")
    quoted[-2] = '"text, with a comma and ""quotes"""'
    assert parse_backends(f"{header}\n{','.join(quoted)}\n")[0] == {"pool": True}
    with pytest.raises(ValueError, match="not a show stat answer"):
        parse_backends("Unknown command.\n")
    # A ValueError, which the loop counts as that node's failure, not a KeyError that would end its whole run.
    with pytest.raises(ValueError, match="lacks act, bck"):
        parse_backends("# pxname,svname,status\npool,BACKEND,UP\n")
