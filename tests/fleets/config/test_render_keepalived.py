"""keepalived.conf rendering (pure core): one VRRP instance per VIP, priorities from node order,
unicast peers, HAProxy tracking, `transparent` VIP binds, and an injection corpus refused."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import replace

import pytest

from apps.core.vrrp import vrid_for
from apps.fleets.config.render import UnsafeValue, render
from apps.fleets.config.spec import FleetSnapshot, ListenerSpec, NodeSpec, VrrpSpec

VRRP = VrrpSpec(interface="eth0", address="10.215.9.11", priority=254, peers=("10.215.9.13", "10.215.9.12"))


def snapshot(*addresses: str) -> FleetSnapshot:
    listeners = tuple(
        ListenerSpec(id=i, lb="web", name=f"l{i}", protocol="http", address=a, port=8000 + i, default_pool_id=None)
        for i, a in enumerate(addresses)
    )
    return FleetSnapshot(fleet="edge", region="us-east", revision=7, listeners=listeners, pools=())


def node(vrrp: VrrpSpec | None = VRRP, **kw) -> NodeSpec:
    return NodeSpec(name="n1", runtime_dir="/run/s15/n1", vrrp=vrrp, **kw)


def keepalived_conf(snap: FleetSnapshot, spec: NodeSpec) -> str:
    return render(snap, spec).files["keepalived.conf"].decode()


def test_one_instance_per_vip_with_unicast_peers_and_haproxy_tracking() -> None:
    conf = keepalived_conf(snapshot("10.215.9.100", "10.215.9.101", "0.0.0.0"), node())
    assert conf.count("vrrp_instance ") == 2  # the wildcard listener has no VIP
    for vip in ("10.215.9.100", "10.215.9.101"):
        assert f"virtual_router_id {vrid_for(vip)}\n" in conf
        assert f"{vip}/32 dev eth0" in conf
    assert "unicast_src_ip 10.215.9.11" in conf and "10.215.9.12\n        10.215.9.13" in conf
    assert "check_unicast_src" in conf and "nopreempt" in conf and "advert_int 0.2\n" in conf
    # The node's own HAProxy master, followed through process events, with the pgrep poll as backstop;
    # every instance tracks both.
    assert 'vrrp_track_process spillway_haproxy_master {\n    process "haproxy"\n    quorum 1\n}' in conf
    assert 'script "/usr/bin/pgrep -f -- /run/s15/n1/master.sock"' in conf
    assert conf.count("track_process {\n        spillway_haproxy_master\n") == 2
    assert conf.count("track_script {\n        spillway_haproxy\n") == 2
    assert "vrrp_priority -20" in conf and "max_auto_priority 50" in conf  # not starved on a busy node
    # By the kernel's name for the binary (comm: the file name, at most 15 characters).
    for haproxy_bin, comm in (("/usr/sbin/haproxy", "haproxy"), ("/opt/haproxy-2.6.12-spillway", "haproxy-2.6.12-")):
        conf = keepalived_conf(snapshot("10.215.9.100"), node(replace(VRRP, haproxy_bin=haproxy_bin)))
        assert f'process "{comm}"\n' in conf
    assert "authentication" not in conf  # VRRPv3 has none; keepalived would ignore it


def test_the_vip_binds_transparent_only_on_vrrp_nodes() -> None:
    snap = snapshot("10.215.9.100")
    assert "bind 10.215.9.100:8000 transparent\n" in render(snap, node()).main
    plain = render(snap, node(None))
    assert "bind 10.215.9.100:8000\n" in plain.main and "keepalived.conf" not in plain.files
    # A loopback override (demo nodes) wins: nothing floats there.
    demo = render(snap, node(bind_address="127.0.0.1"))
    assert "bind 127.0.0.1:8000\n" in demo.main and "keepalived.conf" not in demo.files


def test_the_file_does_not_change_with_the_revision() -> None:
    """A route-only change must leave keepalived.conf byte-identical (the node then takes it through the
    runtime API without a reload)."""
    snap = snapshot("10.215.9.100")
    assert keepalived_conf(snap, node()) == keepalived_conf(replace(snap, revision=8), node())


def test_vrrpv2_authenticates_with_the_secret_and_whole_seconds() -> None:
    v2 = replace(VRRP, version=2, advert_ms=1000, auth_pass="s3cr3tAB")
    conf = keepalived_conf(snapshot("10.215.9.100"), node(v2))
    assert "vrrp_version 2" in conf and "auth_type PASS" in conf and "auth_pass s3cr3tAB" in conf
    assert "advert_int 1\n" in conf
    with pytest.raises(UnsafeValue) as exc:
        render(snapshot("10.215.9.100"), node(replace(v2, advert_ms=200)))
    assert exc.value.field == "node.vrrp.advert_ms"


def test_a_drained_node_tracks_a_failing_script_so_its_vips_move() -> None:
    conf = keepalived_conf(snapshot("10.215.9.100"), node(replace(VRRP, drained=True)))
    assert 'script "/bin/false"' in conf and conf.count("spillway_drained") == 2


def test_a_vip_that_cannot_float_is_left_out_without_failing_the_node() -> None:
    """Another tenant's clashing or IPv6 VIP must not stop this node's render (a shared fleet)."""
    assert vrid_for("10.215.9.100") == vrid_for("10.215.10.99")  # 255 apart
    conf = keepalived_conf(snapshot("10.215.9.100", "10.215.10.99", "2001:db8::5"), node())
    assert conf.count("vrrp_instance ") == 1 and "10.215.9.100/32" in conf  # the older listener's stays
    assert "# VIP left out: 10.215.10.99 (web.l1): router id" in conf
    assert "# VIP left out: 2001:db8::5 (web.l2): not of the nodes' IP family" in conf


INJECTIONS = [
    ("interface", "eth0\n}\nvrrp_script x {"),
    ("interface", "eth0 }"),
    ("interface", "a" * 16),
    ("interface", ""),
    ("interface", 'eth0"'),
    ("address", "10.215.9.11\nunicast_peer {"),
    ("address", "evil.example"),
    ("peers", ("10.215.9.12 }",)),
    ("peers", ("10.215.9.12\n    10.0.0.1",)),
    ("peers", ("10.215.9.11",)),  # itself
    ("peers", ("fd00::1",)),  # another family
    ("priority", 255),
    ("priority", 0),
    ("priority", "254\n"),
    ("version", 4),
    ("advert_ms", 5),
    ("advert_ms", "200 }"),
    ("auth_pass", "abc\n}"),
    ("haproxy_bin", '/usr/sbin/haproxy" "-x'),
    ("haproxy_bin", "/usr/sbin/ha proxy"),
    ("haproxy_bin", "haproxy\n}"),
    ("haproxy_bin", "-W"),
    ("haproxy_bin", ""),
    ("haproxy_bin", "/opt/../x\\y"),
    ("process_events", "yes"),
]


@pytest.mark.parametrize(("field", "value"), INJECTIONS)
def test_injection_corpus_is_refused(field: str, value: object) -> None:
    vrrp = replace(VRRP, **{field: value})
    if field == "auth_pass":
        vrrp = replace(vrrp, version=2, advert_ms=1000)
    with pytest.raises(UnsafeValue) as exc:
        render(snapshot("10.215.9.100"), node(vrrp))
    assert exc.value.field.startswith(f"node.vrrp.{field}")


@pytest.mark.skipif(not shutil.which("keepalived"), reason="keepalived not installed")
def test_keepalived_accepts_what_we_render(tmp_path) -> None:
    """`keepalived -t` checks the interface exists; use the first non-loopback one of this host."""
    links = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True, check=True).stdout
    names = [line.split(": ")[1].split("@")[0] for line in links.splitlines()]
    candidates = [n for n in names if n != "lo"]
    if not candidates:
        pytest.skip("no non-loopback interface")
    v2 = replace(VRRP, interface=candidates[0], version=2, advert_ms=1000, auth_pass="abc123")
    for spec in (replace(VRRP, interface=candidates[0]), v2):
        path = tmp_path / "keepalived.conf"
        path.write_text(keepalived_conf(snapshot("10.215.9.100", "10.215.9.101"), node(spec)))
        result = subprocess.run(["keepalived", "-t", "-l", "-f", str(path)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        assert "Unknown keyword" not in result.stdout + result.stderr


@pytest.mark.skipif(not shutil.which("haproxy"), reason="haproxy not installed")
def test_haproxy_accepts_the_vip_bind(tmp_path) -> None:
    """The VRRP node's haproxy.cfg passes `haproxy -c -dW` (2.6 knows `transparent`, not `freebind`)."""
    bundle = render(snapshot("10.215.9.100"), node())
    for name, content in bundle.files.items():  # maps the config names must exist next to it
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(content)
    (tmp_path / "run").mkdir()
    text = (tmp_path / "haproxy.cfg").read_text().replace("/run/s15/n1", str(tmp_path / "run"))
    (tmp_path / "haproxy.cfg").write_text(text)
    (tmp_path / "run" / "server-state").write_text("1\n")
    result = subprocess.run(["haproxy", "-c", "-dW", "-f", "haproxy.cfg"], cwd=tmp_path, capture_output=True,
                            text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_a_node_without_process_events_keeps_only_the_poll() -> None:
    """keepalived in a network namespace of its own gets no process events and would hold every instance
    in FAULT over an unanswered track_process: such a node renders without it."""
    conf = keepalived_conf(snapshot("10.215.9.100"), node(replace(VRRP, process_events=False)))
    assert "track_process" not in conf and "process_monitor_rcv_bufs" not in conf
    assert "track_script {\n        spillway_haproxy\n" in conf
