"""Floating VIPs on real hosts: three network namespaces on one bridge, each with its own sshd, HAProxy
and keepalived, configured by Spillway through the SSH transport (tests/netns.py).

One module-scoped topology keeps the cost down; each test builds its fleet in the database, rolls it
out for real, and leaves the hosts serving whatever it pushed last (the next test pushes its own).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

import pytest
from django.test import Client

from apps.accounts.principal import Principal
from apps.balancers.models import IpPool, Listener, LoadBalancer, Member, Pool, PoolRegion, Region, StaticIP
from apps.core import crypto
from apps.fleets import services
from apps.fleets.health.vips import fleet_vip_holders
from apps.fleets.models import Fleet, Node, NodeResult
from tests import netns
from tests.deps import missing
from tests.fleets.fleetkit import reconcile
from tests.netutil import http_get
from tests.waiting import wait_for

# Not root: namespaces cannot be made here at all (a plain skip). A missing binary (keepalived is
# `.ci/apt-packages`' business) is a missing dependency, which fails `make test` instead of skipping quietly.
pytestmark = [pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces need root"),
              pytest.mark.process]  # keepalived and HAProxy in namespaces

VIP_PORT = 80


@pytest.fixture(scope="module")
def topo():
    if why := netns.available():
        missing(why)
    topology = netns.Topology(prefix="s15t", subnet=10, count=3, base=Path(tempfile.mkdtemp(prefix="s15t-")))
    namespaces: set[int] = set()
    try:
        topology.up()
        namespaces = topology.namespace_ids()
        yield topology
    finally:
        topology.down()
    # Nothing the hosts ran outlives them: sshd's sessions of the fleet's SSH connections once did, for good.
    assert netns.processes_in(namespaces) == []


def vip_fleet(topo: netns.Topology, org, vip: str) -> tuple[Fleet, Listener]:
    """An LB whose listener has `vip` attached, on a fleet of the three hosts (SSH, VRRP on eth0);
    its pool's member is each host's own loopback backend, which answers with the host's name."""
    region, _ = Region.objects.get_or_create(slug="us-east", defaults={"name": "US East"})
    fleet = Fleet.objects.create(name="vipfleet", region=region)
    lb = LoadBalancer.objects.create(org=org, name="vipweb", fleet=fleet)
    pool = Pool.objects.create(lb=lb, org=org, name="www", health_path="")
    PoolRegion.objects.create(pool=pool, region=region, max_rate_per_member=None)
    Member.objects.create(pool=pool, region=region, name="local", address="127.0.0.1", port=netns.BACKEND_PORT)
    ip_pool = IpPool.objects.create(name="vips", cidr=f"{topo.network}.96/27", region=region)
    static_ip = StaticIP.objects.create(pool=ip_pool, address=vip, org=org, state=StaticIP.State.ASSIGNED)
    listener = Listener.objects.create(lb=lb, name="http", port=VIP_PORT, default_pool=pool, static_ip=static_ip)
    for host in topo.hosts:
        Node.objects.create(fleet=fleet, name=host.name, ssh_private_key_encrypted=crypto.encrypt(topo.client_key),
                            **topo.ssh_fields(host))
    return fleet, listener


def roll_out(fleet: Fleet) -> None:
    result = reconcile(fleet)
    nodes = list(fleet.nodes.all())
    errors = [(r.node.name, r.status, r.error) for r in NodeResult.objects.filter(rollout__fleet=fleet)
              .select_related("node").order_by("-pk")[:3]]
    assert all(n.status == Node.Status.UP for n in nodes), (result, errors)


def served_by(vip: str, timeout_s: float = 1.0) -> str:
    try:
        status, body = http_get(f"http://{vip}:{VIP_PORT}/", timeout_s=timeout_s)
    except OSError as exc:
        return f"error: {exc}"
    return body if status == 200 else f"status {status}"


def one_holder(topo: netns.Topology, vip: str, timeout_s: float = 5.0) -> str:
    assert wait_for(lambda: len(topo.holders(vip)) == 1, timeout_s), topo.holders(vip)
    return topo.holders(vip)[0]


@pytest.mark.django_db(transaction=True)
def test_the_vip_is_served_by_exactly_one_node_and_spillway_reads_which(topo, ops, otto) -> None:
    vip = topo.vip(1)
    fleet, listener = vip_fleet(topo, ops, vip)
    roll_out(fleet)
    holder = one_holder(topo, vip)
    assert holder == "n1"  # the first node has the highest priority
    # Stable: still exactly one holder a few adverts later, and it is the one answering.
    time.sleep(1.0)
    assert topo.holders(vip) == ["n1"]
    assert served_by(vip) == "n1"
    # The product reads the holder from the nodes themselves, through SSH.
    holding = fleet_vip_holders(fleet, [vip])[vip]
    assert holding.holders == ("n1",) and holding.unreachable == ()
    # ... and the workspace's listener shows VIP -> holder -> health.
    client = Client()
    client.force_login(otto.user)
    cell = client.get(f"/listeners/{listener.pk}/vip/").content.decode()
    assert '<strong>n1</strong> <span class="badge">up</span>' in cell and 'data-state="ok"' in cell
    # ... and so does the API, over SSH to each node.
    body = otto.client.get(f"/api/v1/listeners/{listener.pk}/vip/").json()
    assert body["address"] == vip and body["fleets"] == [
        {"fleet": "vipfleet", "region": "us-east", "state": "ok", "holders": [{"node": "n1", "status": "up"}],
         "unreachable": []}]
    # Every node binds the VIP already (transparent): a backup is ready before it owns the address.
    for host in topo.hosts:
        listening = netns.sh("ip", "netns", "exec", host.netns, "ss", "-ltnH").stdout
        assert f"{vip}:{VIP_PORT}" in listening, (host.name, listening)


@pytest.mark.django_db(transaction=True)
def test_a_push_that_reloads_haproxy_leaves_the_vip_where_it_is(topo, ops) -> None:
    """A reload re-executes the HAProxy master (2.6 inserts `-sf <pids>` after argv[0]) and SIGHUPs
    keepalived: neither may look like a dead HAProxy, or every push would move every VIP."""
    vip = topo.vip(4)
    fleet, listener = vip_fleet(topo, ops, vip)
    roll_out(fleet)
    holder = one_holder(topo, vip)
    host = next(h for h in topo.hosts if h.name == holder)
    log_before = len((host.dir / "keepalived.log").read_text())
    master_pid = host.procs["haproxy"].pid
    pool = listener.default_pool
    pool.algorithm = "leastconn"
    pool.save()
    roll_out(fleet)
    assert "balance leastconn" in (Path(host.config_dir) / "current" / "haproxy.cfg").read_text()
    time.sleep(1.0)  # five adverts
    assert topo.holders(vip) == [holder] and served_by(vip) == holder
    assert host.procs["haproxy"].pid == master_pid and host.procs["haproxy"].poll() is None
    since = (host.dir / "keepalived.log").read_text()[log_before:]
    assert "Reloading" in since  # keepalived did take the new file
    assert "Quorum lost" not in since and "FAULT" not in since, since


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("process_events", "vip_index", "seen_by"), [
    (True, 2, "Quorum lost for tracked process spillway_haproxy_master"),  # kernel process events, at once
    (False, 5, "VRRP_Script(spillway_haproxy) failed"),  # a node whose keepalived gets none: the 1 s poll
])
def test_killing_the_holders_haproxy_moves_the_vip_once(topo, ops, process_events, vip_index, seen_by) -> None:
    vip = topo.vip(vip_index)
    fleet, _ = vip_fleet(topo, ops, vip)
    fleet.nodes.update(vrrp_process_events=process_events)
    roll_out(fleet)
    holder = one_holder(topo, vip)
    host = next(h for h in topo.hosts if h.name == holder)
    log_before = len((host.dir / "keepalived.log").read_text())
    killed_at = time.monotonic()
    topo.kill_haproxy(host)
    def moved() -> bool:
        # One short request a look: while the VIP is between holders a connect can hang until its timeout, and
        # that wait would count as time the VIP took to move.
        body = served_by(vip, timeout_s=0.3)
        return body != holder and not body.startswith(("error", "status"))

    try:
        assert wait_for(moved, timeout_s=5.0), served_by(vip)
        moved_ms = (time.monotonic() - killed_at) * 1000
        new_holder = one_holder(topo, vip)
        assert new_holder != holder and served_by(vip) == new_holder
        assert moved_ms < 3000, moved_ms
        since = (host.dir / "keepalived.log").read_text()[log_before:]
        assert seen_by in since, since
        if not process_events:
            assert "Quorum" not in since
    finally:
        topo.start_haproxy(host)
    # The old holder's HAProxy is back: no flap-back (nopreempt), the VIP stays where it went.
    time.sleep(3.0)
    assert topo.holders(vip) == [new_holder]


@pytest.mark.django_db(transaction=True)
def test_draining_the_holder_moves_its_vip_before_its_traffic_drains(topo, ops, otto) -> None:
    vip = topo.vip(3)
    fleet, _ = vip_fleet(topo, ops, vip)
    roll_out(fleet)
    holder = one_holder(topo, vip)
    node = fleet.nodes.get(name=holder)
    principal = Principal(org=ops, role=otto.role, user_id=otto.user.pk)
    services.node_save(principal=principal, node=node, data={"drained": True})
    services.fleet_reconcile(fleet_id=fleet.pk)
    # keepalived takes the new file on SIGHUP and runs the drained check within its 1 s interval, so
    # the old holder may still hold the VIP when the reconcile returns: wait for it to leave.
    assert wait_for(lambda: len(topo.holders(vip)) == 1 and topo.holders(vip) != [holder], 5.0), topo.holders(vip)
    new_holder = one_holder(topo, vip)
    assert new_holder != holder
    assert wait_for(lambda: served_by(vip) == new_holder, 3.0), served_by(vip)
    # The drained node still runs its HAProxy (its connections finish there); only the VIP left.
    host = next(h for h in topo.hosts if h.name == holder)
    assert host.procs["haproxy"].poll() is None
    assert "spillway_drained" in (Path(host.config_dir) / "current" / "keepalived.conf").read_text()

