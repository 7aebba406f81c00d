"""LocalTransport against real HAProxy masters: push, validate, activate, rollback, drain."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from apps.fleets.config.digest import set_digest
from apps.fleets.node.transports import Transport, local, transport_for
from apps.fleets.node.transports.base import SPARE_PREFIX, NodeConn
from apps.fleets.node.transports.digests import recorded_digest
from apps.fleets.node.transports.local import SPARES_KEPT, LocalTransport, _set_signature
from tests.haproxykit import HAProxyNodeFactory, SimpleBundle, pool_config, standard_global
from tests.netutil import http_get

pytestmark = pytest.mark.haproxy


def text_config(port: int, text: str, extra_bind: str = "", rules: str = "") -> str:
    binds = f"    bind 127.0.0.1:{port}\n" + (f"    bind {extra_bind}\n" if extra_bind else "")
    return f"""
frontend fe
{binds}{rules}    http-request return status 200 content-type text/plain string {text}
"""


def serving(port: int) -> str:
    try:
        return http_get(f"http://127.0.0.1:{port}/", timeout_s=1.0)[1]
    except OSError as exc:
        return f"error: {exc}"


def bundle_for(node, body: str, files: dict[str, bytes] | None = None) -> SimpleBundle:
    return SimpleBundle.of({"haproxy.cfg": (standard_global(node) + body).encode(), **(files or {})})


def pid_gone(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.02)
    return False


def test_push_and_activate_serve_the_new_config_and_retire_the_old_worker(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    transport = LocalTransport(node)
    assert serving(port) == "v1"
    bundle = bundle_for(
        node,
        text_config(
            port,
            "v2",
            rules="    http-request return status 200 content-type text/plain string mapped "
            "if { path,map_beg(maps/paths.map) -m found }\n",
        ),
        {"maps/paths.map": b"/mapped yes\n", "certs/site.pem": b"not really a cert\n"},
    )

    pushed = transport.push(bundle)
    assert pushed.ok, pushed.validation_output
    assert serving(port) == "v1"  # a push alone changes nothing that is served
    result = transport.activate()

    assert result.ok, result.error
    assert serving(port) == "v2"
    assert http_get(f"http://127.0.0.1:{port}/mapped/x")[1] == "mapped"  # maps/ resolved in the set
    assert pid_gone(result.old_worker_pids[0], 5.0)
    assert transport.show_proc().current_worker.pid == result.new_worker_pid
    assert transport.config_sha256() == pushed.sha256 == set_digest(bundle.files)
    current = Path(node.current_dir)
    assert stat.S_IMODE((current / "haproxy.cfg").stat().st_mode) == 0o644
    assert stat.S_IMODE((current / "maps" / "paths.map").stat().st_mode) == 0o644
    assert stat.S_IMODE((current / "certs" / "site.pem").stat().st_mode) == 0o600
    assert Path(node.previous_dir).resolve() != current.resolve()


def test_a_push_links_the_files_the_current_set_already_has_and_writes_the_changed_ones(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    """GIVEN a set with many certificate files, WHEN a push changes one of them, THEN the new set shares
    the unchanged files with the current one (same inode: nothing written again), holds the new
    content of the changed one, the old set keeps its own content (rollback target), modes stay."""
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    transport = LocalTransport(node)
    files = {f"certs/c{i}.pem": f"cert {i}\n".encode() for i in range(20)}
    first = transport.push(bundle_for(node, text_config(port, "v1"), files))
    assert first.ok, first.validation_output
    old_set = Path(node.current_dir).resolve()

    second = transport.push(bundle_for(node, text_config(port, "v1"), {**files, "certs/c7.pem": b"renewed\n"}))

    assert second.ok, second.validation_output
    new_set = Path(node.current_dir).resolve()
    assert new_set != old_set and Path(node.previous_dir).resolve() == old_set
    for i in range(20):
        name = f"certs/c{i}.pem"
        assert ((new_set / name).stat().st_ino == (old_set / name).stat().st_ino) == (i != 7)
        assert stat.S_IMODE((new_set / name).stat().st_mode) == 0o600
    assert (new_set / "certs/c7.pem").read_bytes() == b"renewed\n"
    assert (old_set / "certs/c7.pem").read_bytes() == b"cert 7\n"
    assert transport.config_sha256() == second.sha256


def test_a_pushed_sets_digest_is_remembered_and_an_edit_on_disk_is_still_seen(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    """Every rollout asks a node for its config's digest; a set this process pushed is not read and hashed
    again (6 MB per node and change at 100k routes), while an edit on disk is hashed and differs. An edit that
    keeps the size and has its mtime set back by hand is seen by a drift check's fresh read."""
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    pushed = LocalTransport(node).push(bundle_for(node, text_config(port, "v1"), {"maps/m.map": b"a 1\n"}))
    assert pushed.ok, pushed.validation_output

    class NotReading(LocalTransport):  # a rollout's own transport, which must not read the set again
        def _read_tree(self, root: str) -> dict[str, bytes]:
            raise AssertionError(f"read {root} again")

    assert NotReading(node).config_sha256() == pushed.sha256

    path = Path(node.current_dir).resolve() / "maps/m.map"
    before = path.stat()
    path.write_bytes(b"a 2\n")  # same size, a new mtime
    on_disk = LocalTransport(node).config_sha256()
    assert on_disk != pushed.sha256
    assert on_disk == set_digest(LocalTransport(node)._read_tree(node.current_dir))

    path.write_bytes(b"a 3\n")
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))  # the old mtime, set back by hand
    fresh = LocalTransport(node).config_sha256(fresh=True)
    assert fresh not in (pushed.sha256, on_disk)
    assert fresh == set_digest(LocalTransport(node)._read_tree(node.current_dir))


def test_the_signature_remembered_for_a_pushed_set_is_the_one_its_listing_gives(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    """A push remembers its new set's signature from the entries of the files it linked and a stat of those it
    wrote, without listing the set: it must equal what a listing gives, or every later rollout would read and hash
    the node's whole set again (a wrong match would hide an edit). Also after an edit, when the push links by
    comparing content instead of from a known set."""
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    files = {"maps/a.map": b"a 1\n", "maps/b.map": b"b 1\n", "certs/c.pem": b"cert\n"}

    def pushed_as_listed(changed: dict[str, bytes]) -> Path:
        files.update(changed)
        pushed = LocalTransport(node).push(bundle_for(node, text_config(port, "v1"), files))
        assert pushed.ok, pushed.validation_output
        root = Path(node.current_dir).resolve()
        remembered = recorded_digest(str(root))
        assert remembered is not None and remembered[1] == pushed.sha256
        assert remembered[0] == _set_signature(str(root))
        return root

    first = pushed_as_listed({})
    second = pushed_as_listed({"maps/b.map": b"b 2\n"})
    assert (second / "maps/a.map").stat().st_ino == (first / "maps/a.map").stat().st_ino  # linked, kept entry
    assert (second / "maps/b.map").stat().st_ino != (first / "maps/b.map").stat().st_ino  # written, stat'ed
    (second / "certs/c.pem").write_bytes(b"cert\n")  # touched on disk: the set is no longer as remembered
    third = pushed_as_listed({"maps/a.map": b"a 3\n"})
    assert (third / "maps/b.map").stat().st_ino == (second / "maps/b.map").stat().st_ino  # linked by content
    assert LocalTransport(node).config_sha256(fresh=True) == recorded_digest(str(third))[1]


def test_old_sets_are_collected_after_a_push_but_never_a_newer_one(haproxy_node: HAProxyNodeFactory, free_port) -> None:
    """A push returns before the sets it retired are removed (unlinking a 100k-route set is a fifth of a
    node's route change); they are gone soon after, current and previous stay, and a set newer than current
    (another process's push between its rename and its link swap) is never taken from under it."""
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    transport = LocalTransport(node)
    pushed = [transport.push(bundle_for(node, text_config(port, f"v{i}"))) for i in range(2, 6)]
    assert all(p.ok for p in pushed)
    in_flight = Path(node.sets_dir) / f"{'a' * 12}-{time.time_ns() + 10**9}-abcdef"
    in_flight.mkdir()
    (in_flight / "haproxy.cfg").write_text("# a push in flight\n")

    transport.push(bundle_for(node, text_config(port, "v6")))
    expected = {os.path.basename(os.readlink(node.current_dir)), os.path.basename(os.readlink(node.previous_dir)),
                in_flight.name}

    def sets() -> set[str]:  # the emptied sets kept for the next pushes are no sets
        return {name for name in os.listdir(node.sets_dir) if not name.startswith(SPARE_PREFIX)}

    deadline = time.monotonic() + 10
    while sets() != expected and time.monotonic() < deadline:
        time.sleep(0.02)
    assert sets() == expected
    spares = [Path(node.sets_dir) / n for n in os.listdir(node.sets_dir) if n.startswith(SPARE_PREFIX)]
    assert 0 < len(spares) <= SPARES_KEPT
    # A spare is an old set under another name: it is no set of the node's (current and previous stay the only
    # sets served or rolled back to), and what it holds is pruned when a push takes it (the next test).
    assert {os.readlink(node.current_dir), os.readlink(node.previous_dir)}.isdisjoint(
        {f"sets/{p.name}" for p in spares})
    assert transport.activate().ok and serving(port) == "v6"
    # The digests remembered for the removed sets go with them (the cache is bounded by what the nodes hold, not
    # by pushes); the current set's stays, so the next rollout does not read it again.
    sets = Path(node.sets_dir).resolve()
    removed = [str(sets / p.set_id) for p in pushed[:-1]]
    while any(recorded_digest(key) for key in removed) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [key for key in removed if recorded_digest(key)] == []
    assert recorded_digest(str(Path(node.current_dir).resolve())) is not None


def _collected(node) -> list[Path]:
    """The node's spares (sorted: the order a push takes them in), once the collector left only current and previous
    as sets. Pushes one after another keep one spare (each push takes the one the last left); a collection that is
    late for the next push leaves more, up to SPARES_KEPT."""
    deadline = time.monotonic() + 10
    while True:
        names = os.listdir(node.sets_dir)
        found = sorted(Path(node.sets_dir) / n for n in names if n.startswith(SPARE_PREFIX))
        if (found and len(names) - len(found) == 2) or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def test_a_push_reuses_an_old_set_keeping_only_the_current_sets_files_it_still_holds(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    """Making a directory, a symlink or a file cost ~0.8 ms of kernel time on one machine of this kind, and a route
    change unlinked and linked again every unchanged file of a set. GIVEN old sets the collector kept (with the
    files newer sets share), WHEN a push runs, THEN it writes its set into one of them (the same directory), keeps
    the files that are still the current set's (the same inodes: nothing unlinked and linked again), and the new
    set holds exactly the bundle's files and serves: a file someone put in a spare, a directory, and a file of the
    spare edited in place never become part of it; a spare that is a symlink is never written through."""
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    transport = LocalTransport(node)
    files = {"maps/m.map": b"a 1\n", "maps/k.map": b"k 1\n", "certs/c.pem": b"cert\n"}
    for i in range(2, 6):
        assert transport.push(bundle_for(node, text_config(port, f"v{i}"), files)).ok
        # Each push's collection before the next push: a late one leaves two spares, and the one named first may be
        # the set v1 served, which never had the maps (1 run in ~25 under load took it and failed on a missing map).
        local._COLLECTOR.submit(lambda: None).result(timeout=10)  # the one collector thread: FIFO
    spares = _collected(node)
    assert 0 < len(spares) <= SPARES_KEPT
    taken = spares[0]  # the one a push takes first (by name)
    before = Path(node.current_dir).resolve()
    assert (taken / "maps/k.map").stat().st_ino == (before / "maps/k.map").stat().st_ino  # shared with current
    # What only the old set had (its own haproxy.cfg: v2..v5 differ; a removed certificate's key would be one) was
    # dropped when it was kept: every file left is shared with a newer set.
    assert not (taken / "haproxy.cfg").exists()
    assert all(p.stat().st_nlink > 1 for p in taken.rglob("*") if p.is_file())
    (taken / "maps" / "stray.map").write_bytes(b"/stray be_evil\n")
    (taken / "junk").mkdir()
    taken_ino = taken.stat().st_ino

    pushed = transport.push(bundle_for(node, text_config(port, "v6"), {**files, "maps/m.map": b"a 2\n"}))

    assert pushed.ok, pushed.validation_output
    current = Path(node.current_dir).resolve()
    assert current.stat().st_ino == taken_ino and not taken.exists()  # the spare, renamed into place
    on_disk = sorted(str(p.relative_to(current)) for p in current.rglob("*") if p.is_file())
    assert on_disk == ["certs/c.pem", "haproxy.cfg", "maps/k.map", "maps/m.map"]
    assert not (current / "junk").exists()
    assert (current / "maps/k.map").stat().st_ino == (before / "maps/k.map").stat().st_ino
    assert (current / "maps/m.map").read_bytes() == b"a 2\n"
    assert (before / "maps/m.map").read_bytes() == b"a 1\n"  # the set served before keeps its content
    assert stat.S_IMODE((current / "certs").stat().st_mode) == 0o700
    assert transport.config_sha256(fresh=True) == pushed.sha256
    assert transport.activate().ok and serving(port) == "v6"

    # A spare that is a symlink (to somewhere else) is dropped, never written through.
    elsewhere = Path(node.config_dir).parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    os.symlink(elsewhere, Path(node.sets_dir) / f"{SPARE_PREFIX}0000")  # sorts first: taken first
    pushed = transport.push(bundle_for(node, text_config(port, "v6"), {**files, "maps/m.map": b"a 2b\n"}))
    assert pushed.ok, pushed.validation_output
    assert (elsewhere / "keep.txt").read_text() == "mine" and not (Path(node.sets_dir) / f"{SPARE_PREFIX}0000").exists()
    assert LocalTransport(node).config_sha256(fresh=True) == pushed.sha256

    # A spare's file edited in place is the current set's too (a hard link): the current set no longer matches what
    # was pushed, so nothing is kept from a spare on trust; the set is still exactly the bundle.
    spare = _collected(node)[0]
    (spare / "maps/k.map").write_bytes(b"k evil\n")
    pushed = transport.push(bundle_for(node, text_config(port, "v7"), {**files, "maps/m.map": b"a 3\n"}))
    assert pushed.ok, pushed.validation_output
    current = Path(node.current_dir).resolve()
    assert (current / "maps/k.map").read_bytes() == b"k 1\n"
    assert LocalTransport(node).config_sha256(fresh=True) == pushed.sha256


def test_previous_is_the_link_current_was_and_a_rollback_goes_back_to_it(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    """A push keeps the link `current` was as `previous` (a second name of it, no new symlink made): it names the
    set served before, and a rollback serves that set again."""
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    transport = LocalTransport(node)
    assert transport.push(bundle_for(node, text_config(port, "v2"))).ok and transport.activate().ok
    before_target, before_link = os.readlink(node.current_dir), os.lstat(node.current_dir).st_ino

    assert transport.push(bundle_for(node, text_config(port, "v3"))).ok and transport.activate().ok

    assert serving(port) == "v3"
    assert os.readlink(node.previous_dir) == before_target
    assert os.lstat(node.previous_dir).st_ino == before_link
    assert os.readlink(node.current_dir) != before_target
    assert transport.rollback().ok and serving(port) == "v2"


def test_a_sets_real_path_is_the_one_realpath_gives_without_resolving_every_part(tmp_path: Path) -> None:
    """The digests of sets are remembered by their real path; a push resolves it from the sets directory (resolved
    once) and the link read. It must be realpath's answer whatever the node's directory is reached through (a
    symlink on the way), and realpath itself for a link that does not name a set of the node."""
    (tmp_path / "real").mkdir()
    (tmp_path / "via").symlink_to(tmp_path / "real")
    node = NodeConn("n", "127.0.0.1", str(tmp_path / "via" / "run"), str(tmp_path / "via" / "etc"))
    sets = Path(node.sets_dir)
    (sets / "abc-1").mkdir(parents=True)
    (sets / "abc-2").mkdir()
    os.symlink("sets/abc-2", node.current_dir)
    os.symlink("sets/abc-1", node.previous_dir)
    transport = LocalTransport(node)
    for path in (node.current_dir, node.previous_dir, str(sets / "abc-1"), str(sets / ".staging-x")):
        assert transport._real(path) == os.path.realpath(path), path
    os.unlink(node.current_dir)
    os.symlink(str(tmp_path / "real"), node.current_dir)  # not a set of the node's: realpath's own answer
    assert transport._real(node.current_dir) == os.path.realpath(node.current_dir) == str(tmp_path / "real")


def test_the_served_record_is_replaced_whole_in_place(tmp_path: Path) -> None:
    """served.json is written over in place (no new file per apply): a shorter record leaves nothing of the longer
    one behind, and a node without one gets one."""
    node = LocalTransport(NodeConn("n", "127.0.0.1", str(tmp_path / "run"), str(tmp_path / "etc")))
    assert node.read_served() is None
    node.write_served(b'{"fleet": 1, "revision": 12345, "rollout": 678}')
    first = os.stat(Path(node.node.config_dir) / "served.json").st_ino
    node.write_served(b'{"fleet": 1, "revision": 9}')
    assert node.read_served() == b'{"fleet": 1, "revision": 9}'
    assert os.stat(Path(node.node.config_dir) / "served.json").st_ino == first


def test_local_nodes_pushing_the_same_large_map_write_it_once_and_never_share_an_edited_copy(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    """A rollout's nodes share their maps; local nodes of one host wrote and fsynced a 5 MB routes map each per
    route change. Pushed side by side, the second node links the first node's file (one inode, one write);
    its set still hashes to its bundle and serves. A copy edited in place on the first node is not linked."""
    from concurrent.futures import ThreadPoolExecutor

    ports = [free_port(), free_port()]
    nodes = [haproxy_node(text_config(port, "v1"))[0] for port in ports]
    routes = b"".join(b"/p%d v%d\n" % (i, i) for i in range(40_000))  # ~500 kB, one object for both nodes
    bundles = [bundle_for(node, text_config(port, "v2"), {"maps/routes.map": routes})
               for node, port in zip(nodes, ports, strict=True)]

    with ThreadPoolExecutor(max_workers=2) as pool:
        pushed = list(pool.map(lambda nb: LocalTransport(nb[0]).push(nb[1]), zip(nodes, bundles, strict=True)))

    assert all(p.ok for p in pushed)
    files = [Path(node.current_dir).resolve() / "maps/routes.map" for node in nodes]
    assert files[0].stat().st_ino == files[1].stat().st_ino and files[0].read_bytes() == routes
    for node, push in zip(nodes, pushed, strict=True):
        assert LocalTransport(node).config_sha256() == push.sha256
        assert LocalTransport(node).activate().ok
    assert [serving(port) for port in ports] == ["v2", "v2"]

    edited_routes = routes.replace(b"/p1 v1\n", b"/p1 v9\n")
    first = LocalTransport(nodes[0]).push(bundle_for(nodes[0], text_config(ports[0], "v3"),
                                                     {"maps/routes.map": edited_routes}))
    assert first.ok
    edited = Path(nodes[0].current_dir).resolve() / "maps/routes.map"
    text = edited.read_bytes()
    with open(edited, "r+b") as handle:  # someone edits node 1's file in place (same inode, same size)
        handle.write(text.replace(b"/p2 v2\n", b"/p2 v8\n", 1)[:len(text)])
    second = LocalTransport(nodes[1]).push(bundle_for(nodes[1], text_config(ports[1], "v3"),
                                                      {"maps/routes.map": edited_routes}))
    assert second.ok
    mine = Path(nodes[1].current_dir).resolve() / "maps/routes.map"
    assert mine.stat().st_ino != edited.stat().st_ino and mine.read_bytes() == edited_routes


def test_a_broken_config_is_refused_by_push_and_the_old_one_keeps_serving(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    transport = LocalTransport(node)
    before = transport.config_sha256()

    pushed = transport.push(bundle_for(node, text_config(port, "v2") + "    no_such_keyword on\n"))

    assert not pushed.ok
    assert "unknown keyword 'no_such_keyword'" in pushed.validation_output
    assert transport.config_sha256() == before
    assert not [e for e in os.listdir(node.sets_dir) if e.startswith(".staging-")]
    assert transport.activate().ok  # reloading what is on disk is still the old config
    assert serving(port) == "v1"


def test_a_config_with_warnings_is_refused(haproxy_node: HAProxyNodeFactory, free_port) -> None:
    """GIVEN an injected line that HAProxy only warns about WHEN pushed THEN -dW refuses it."""
    port = free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    body = text_config(port, "v2") + "    option httplog\n"  # httplog without a log target: warning
    pushed = LocalTransport(node).push(bundle_for(node, body))
    assert not pushed.ok
    assert "WARNING" in pushed.validation_output


def test_bundle_paths_cannot_escape_the_config_set(haproxy_node: HAProxyNodeFactory, free_port) -> None:
    node, _proc = haproxy_node(text_config(free_port(), "v1"))
    with pytest.raises(ValueError, match=r"only haproxy\.cfg"):
        LocalTransport(node).push(SimpleBundle.of({"haproxy.cfg": b"", "../../etc/passwd": b"x"}))
    with pytest.raises(ValueError, match="path part"):
        LocalTransport(node).push(SimpleBundle.of({"haproxy.cfg": b"", "maps/../x": b"x"}))


def _hold_port(port: int) -> subprocess.Popen[bytes]:
    """Another process holding a TCP port (as a stray service would)."""
    code = (
        "import socket,sys,time;s=socket.socket();"
        f"s.bind(('127.0.0.1',{port}));s.listen();print('ok',flush=True);time.sleep(60)"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline().strip() == b"ok"
    return proc


def test_a_reload_that_fails_at_bind_is_reported_and_rollback_restores_the_config(
    haproxy_node: HAProxyNodeFactory, free_port
) -> None:
    """GIVEN a new config binding a port another process holds (haproxy -c does not bind,
    so push accepts it) WHEN activated THEN the reload fails, the old worker survives,
    and rollback puts the previous config back on disk and reloads it."""
    port, busy = free_port(), free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    transport = LocalTransport(node)
    v1_sha = transport.config_sha256()
    holder = _hold_port(busy)
    try:
        pushed = transport.push(bundle_for(node, text_config(port, "v2", extra_bind=f"127.0.0.1:{busy}")))
        assert pushed.ok, pushed.validation_output

        failed = transport.activate(timeout_s=10)

        assert not failed.ok
        assert "failed: 1" in (failed.error or "")
        assert f"cannot bind socket (Address already in use) for [127.0.0.1:{busy}]" in (failed.error or "")
        assert [w.pid for w in transport.show_proc().workers] == failed.old_worker_pids
        assert serving(port) == "v1"

        rolled = transport.rollback()

        assert rolled.ok, rolled.error
        assert transport.config_sha256() == v1_sha
        assert serving(port) == "v1"
        assert transport.probe_listeners([("127.0.0.1", port)]) == {("127.0.0.1", port): True}
    finally:
        holder.kill()
        holder.wait()


def test_rollback_without_a_previous_set_says_so(tmp_path: Path) -> None:
    node = NodeConn("n", "127.0.0.1", str(tmp_path / "run"), str(tmp_path / "etc"))
    result = LocalTransport(node).rollback()
    assert not result.ok
    assert "no previous config" in (result.error or "")


def test_drain_takes_effect_without_reload_and_survives_the_next_reload(
    haproxy_node: HAProxyNodeFactory, tiny_backend, free_port
) -> None:
    b1, b2 = tiny_backend("b1"), tiny_backend("b2")
    port = free_port()
    node, _proc = haproxy_node(pool_config(port, b1, b2))
    transport = LocalTransport(node)
    stats = transport.stats()
    worker = transport.show_proc().current_worker

    stats.set_server_state("pool", "b1", "drain")

    status = {r.svname: r.status for r in stats.show_stat() if r.pxname == "pool"}
    assert status == {"b1": "DRAIN", "b2": "no check", "BACKEND": "UP"}
    hits = b1.hits
    assert [http_get(f"http://127.0.0.1:{port}/")[1] for _ in range(8)] == ["b2"] * 8
    assert b1.hits == hits
    assert transport.show_proc().current_worker.pid == worker.pid  # no reload happened (its uptime moves on)

    # Same servers, new text: the reload must keep b1 drained (server-state-file).
    pushed = transport.push(bundle_for(node, pool_config(port, b1, b2) + "# revision 2\n"))
    assert pushed.ok, pushed.validation_output
    result = transport.activate()
    assert result.ok, result.error

    status = {r.svname: r.status for r in transport.stats().show_stat() if r.pxname == "pool"}
    assert status["b1"] == "DRAIN"
    assert [http_get(f"http://127.0.0.1:{port}/")[1] for _ in range(4)] == ["b2"] * 4
    assert b1.hits == hits


def test_runtime_passes_commands_through(haproxy_node: HAProxyNodeFactory, free_port) -> None:
    node, _proc = haproxy_node(text_config(free_port(), "v1"))
    transport = transport_for(node)
    assert isinstance(transport, LocalTransport) and isinstance(transport, Transport)
    assert "Version: 2." in transport.runtime("show info")


def test_probe_listeners_tells_open_from_closed(haproxy_node: HAProxyNodeFactory, free_port) -> None:
    port, closed = free_port(), free_port()
    node, _proc = haproxy_node(text_config(port, "v1"))
    probes = LocalTransport(node).probe_listeners([("127.0.0.1", port), ("127.0.0.1", closed)], timeout_s=0.5)
    assert probes == {("127.0.0.1", port): True, ("127.0.0.1", closed): False}
    with socket.socket() as sock:  # the closed one really is closed
        assert sock.connect_ex(("127.0.0.1", closed)) != 0
