"""SshTransport against a real OpenSSH sshd on loopback driving a real HAProxy master.

The "remote" node is this machine reached through sshd: every file operation goes
over SFTP, validation runs as a remote command, and the HAProxy sockets and listener
probes go through SSH forwarding channels.
"""

from __future__ import annotations

import dataclasses
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from apps.fleets import caches
from apps.fleets.config.check import descendants
from apps.fleets.config.digest import set_digest
from apps.fleets.node.runtime_api import HAProxySocket
from apps.fleets.node.transports.base import HostKeyMismatch, NodeConn, TransportError
from apps.fleets.node.transports.ssh import SshTransport
from tests.haproxykit import HAProxyNodeFactory, SimpleBundle, SshdInfo, standard_global
from tests.netutil import http_get

pytestmark = pytest.mark.haproxy


def text_config(port: int, text: str) -> str:
    return f"""
frontend fe
    bind 127.0.0.1:{port}
    http-request return status 200 content-type text/plain string {text}
"""


def serving(port: int) -> str:
    return http_get(f"http://127.0.0.1:{port}/", timeout_s=1.0)[1]


@pytest.fixture
def ssh_node(
    haproxy_node: HAProxyNodeFactory, sshd: SshdInfo, free_port
) -> Iterator[tuple[NodeConn, SshTransport, int]]:
    port = free_port()
    local, _proc = haproxy_node(text_config(port, "v1"))
    node = sshd.node(local)
    transport = SshTransport(node)
    try:
        yield node, transport, port
    finally:
        transport.close()


def test_push_activate_and_rollback_over_ssh(ssh_node) -> None:
    node, transport, port = ssh_node
    v1_sha = transport.config_sha256()
    bundle = SimpleBundle.of(
        {
            "haproxy.cfg": (standard_global(node) + text_config(port, "v2")).encode(),
            "certs/site.pem": b"not really a cert\n",
        }
    )

    pushed = transport.push(bundle)
    assert pushed.ok, pushed.validation_output
    assert transport.config_sha256() == pushed.sha256 == set_digest(bundle.files)
    assert stat.S_IMODE((Path(node.current_dir) / "certs" / "site.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((Path(node.current_dir) / "haproxy.cfg").stat().st_mode) == 0o644

    activated = transport.activate()
    assert activated.ok, activated.error
    assert serving(port) == "v2"
    assert transport.show_proc().current_worker.pid == activated.new_worker_pid

    rolled = transport.rollback()
    assert rolled.ok, rolled.error
    assert serving(port) == "v1"
    assert transport.config_sha256() == v1_sha


def test_the_digest_of_a_pushed_set_is_not_read_back_until_the_set_changes_on_the_node(ssh_node, monkeypatch) -> None:
    """A rollout asks every node which set it serves: answered from the digest of the set Spillway pushed while the
    set's files keep their names, modes, sizes and mtimes (one SFTP directory listing per directory). An edit on the
    node is seen; a drift check (fresh) always reads and hashes the files."""
    node, transport, port = ssh_node
    bundle = SimpleBundle.of({"haproxy.cfg": (standard_global(node) + text_config(port, "v2")).encode(),
                              "maps/a.map": b"/a 1\n"})
    assert transport.push(bundle).ok
    reads: list[str] = []
    real_read_tree = SshTransport._read_tree
    monkeypatch.setattr(SshTransport, "_read_tree", lambda self, root: reads.append(root) or real_read_tree(self, root))

    assert transport.config_sha256() == bundle.sha256 and reads == []

    edited = Path(node.current_dir) / "maps" / "a.map"
    edited.write_bytes(b"/a 1\n/evil 2\n")  # by hand on the node: size and mtime move
    on_disk = transport.config_sha256()
    assert on_disk == set_digest({**bundle.files, "maps/a.map": b"/a 1\n/evil 2\n"}) != bundle.sha256
    assert len(reads) == 1
    assert transport.config_sha256(fresh=True) == on_disk and len(reads) == 2


def test_a_push_links_the_files_it_keeps_from_the_set_it_pushed_unless_that_set_was_edited(ssh_node) -> None:
    """A route change moves one map of many: the others are hard-linked from the current set over SFTP, not written
    and fsynced again. Not when the current set was edited on the node: the edit must not reach the new set."""
    node, transport, port = ssh_node
    cfg = (standard_global(node) + text_config(port, "v2")).encode()
    kept, moved = b"/kept 1\n", b"/moved 1\n"
    first = transport.push(SimpleBundle.of({"haproxy.cfg": cfg, "maps/kept.map": kept, "maps/moved.map": moved}))
    assert first.ok
    before = Path(node.current_dir).resolve()

    second = transport.push(SimpleBundle.of({"haproxy.cfg": cfg, "maps/kept.map": kept, "maps/moved.map": b"/m 2\n"}))
    assert second.ok
    after = Path(node.current_dir).resolve()
    assert after != before
    assert (after / "maps/kept.map").stat().st_ino == (before / "maps/kept.map").stat().st_ino
    assert (after / "maps/moved.map").stat().st_ino != (before / "maps/moved.map").stat().st_ino
    assert transport.config_sha256(fresh=True) == second.sha256

    caches.reset("set_digests")  # a worker that knows nothing of the node yet (took the fleet over, restarted)
    assert transport.config_sha256() == second.sha256  # read from the node, and remembered with its files
    fourth = transport.push(SimpleBundle.of({"haproxy.cfg": cfg, "maps/kept.map": kept[:-1] + b"\n",  # equal, not same
                                             "maps/moved.map": b"/m 4\n"}))
    assert fourth.ok
    assert (Path(node.current_dir).resolve() / "maps/kept.map").stat().st_ino == (after / "maps/kept.map").stat().st_ino
    after = Path(node.current_dir).resolve()

    (after / "maps/kept.map").write_bytes(b"/kept 1\n/evil 9\n")  # by hand on the node
    third = transport.push(SimpleBundle.of({"haproxy.cfg": cfg, "maps/kept.map": kept, "maps/moved.map": b"/m 3\n"}))
    assert third.ok
    latest = Path(node.current_dir).resolve()
    assert (latest / "maps/kept.map").read_bytes() == kept
    assert transport.config_sha256(fresh=True) == third.sha256


def test_a_broken_config_is_refused_on_the_node(ssh_node) -> None:
    node, transport, port = ssh_node
    before = transport.config_sha256()
    bad = standard_global(node) + text_config(port, "v2") + "    no_such_keyword on\n"

    pushed = transport.push(SimpleBundle.of({"haproxy.cfg": bad.encode()}))

    assert not pushed.ok
    assert "unknown keyword 'no_such_keyword'" in pushed.validation_output
    assert transport.config_sha256() == before
    assert serving(port) == "v1"


def test_runtime_api_and_probes_go_through_the_ssh_connection(ssh_node, free_port) -> None:
    _node, transport, port = ssh_node
    assert "Version: 2." in transport.runtime("show info")
    rows = transport.stats().show_stat()
    assert any(r.pxname == "fe" and r.svname == "FRONTEND" for r in rows)
    closed = free_port()
    assert transport.probe_listeners([("127.0.0.1", port), ("127.0.0.1", closed)], timeout_s=1.0) == {
        ("127.0.0.1", port): True,
        ("127.0.0.1", closed): False,
    }


def test_a_large_runtime_answer_arrives_whole_over_ssh(ssh_node) -> None:
    """An answer of megabytes (`show map` of a big map, `show stat` at many pools) reaches the caller whole
    over the forwarding channel, as the node's own socket gives it: SSHReader.read(n) returns what has arrived
    so far, and a reader that took that for the answer cut it at the first packets."""
    node, transport, port = ssh_node
    entries = "".join(f"host{i:06d}.example.com/some/longer/path/{i} p{i % 977}_us\n" for i in range(60_000))
    config = standard_global(node) + text_config(port, "v2").replace(
        "    http-request return",
        "    http-request set-var(txn.p) path,map_beg(maps/big.map)\n    http-request return")
    pushed = transport.push(SimpleBundle.of({"haproxy.cfg": config.encode(), "maps/big.map": entries.encode()}))
    assert pushed.ok, pushed.validation_output
    assert transport.activate().ok

    over_ssh = transport.runtime("show map maps/big.map")
    local = HAProxySocket(node.stats_socket_path, timeout_s=30).command("show map maps/big.map")
    assert len(local) > 3_000_000 and local.count("\n") >= 60_000
    assert over_ssh == local


def _other_host_key(tmp_path: Path) -> str:
    key = tmp_path / "other_host_key"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    return key.with_suffix(".pub").read_text().strip()


def test_a_wrong_host_key_is_refused_before_anything_is_sent(
    haproxy_node: HAProxyNodeFactory, sshd: SshdInfo, tmp_path: Path
) -> None:
    local = haproxy_node.conn("never-touched")
    node = dataclasses.replace(sshd.node(local), ssh_known_hosts=_other_host_key(tmp_path))
    transport = SshTransport(node)
    try:
        with pytest.raises(HostKeyMismatch, match="does not match the pinned key") as caught:
            transport.push(SimpleBundle.of({"haproxy.cfg": b"global\n"}))
        assert sshd.host_public_key.split()[0] in str(caught.value)  # names the key it saw
    finally:
        transport.close()
    assert not Path(local.config_dir).exists()


def test_a_bare_pinned_key_line_is_accepted(ssh_node, sshd: SshdInfo) -> None:
    node, _transport, _port = ssh_node
    bare = SshTransport(dataclasses.replace(node, ssh_known_hosts=sshd.host_public_key))
    try:
        assert bare.config_sha256() is not None
    finally:
        bare.close()


def test_an_empty_pin_is_refused(haproxy_node: HAProxyNodeFactory, sshd: SshdInfo) -> None:
    node = dataclasses.replace(sshd.node(haproxy_node.conn("x")), ssh_known_hosts="")
    with pytest.raises(TransportError, match="no pinned SSH host key"):
        SshTransport(node)


def test_a_command_whose_connection_is_lost_is_run_again_not_read_as_a_refusal(ssh_node, sshd) -> None:
    """The node rebooted or its link went away while a command ran: the channel closes with no exit status. Read as
    exit code -1 that was "the node refused the config" with no output (bench-chaos: a rollout failed and the node
    was not retried with that revision); now the transport reconnects and runs it again."""
    import os
    import signal
    import threading
    import time

    _node, transport, _port = ssh_node
    assert transport._run(["true"], "/", 10) == (0, "")  # connected
    sessions = descendants({sshd.pid}) - {sshd.pid}
    assert sessions, "no sshd session process for the transport's connection"
    answer: list[tuple[int, str]] = []
    runner = threading.Thread(target=lambda: answer.append(transport._run(["sleep", "1"], "/", 30)))
    runner.start()
    time.sleep(0.4)  # the command runs
    for pid in sessions:
        os.kill(pid, signal.SIGKILL)  # the connection goes, as with a node that reboots
    runner.join(30)
    assert answer == [(0, "")]
