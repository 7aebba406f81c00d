"""A control plane must not become an attack tool: targets, addresses, redirects and caps."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator

import pytest

from apps.balancers.models import StaticIP
from apps.capacity import safety
from apps.capacity.engine import LoadPlan, Target, run_plan
from apps.capacity.models import CapacityTest, TargetAllowlist
from apps.core.errors import DomainError
from tests.factories import RegionFactory, RouteFactory

# --- addresses (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize(("address", "kind"), [
    ("169.254.169.254", "metadata"),
    ("fd00:ec2::254", "metadata"),
    ("::ffff:169.254.169.254", "metadata"),
    ("169.254.10.1", "link-local"),
    ("fe80::1", "link-local"),
    ("10.1.2.3", "private"),
    ("172.16.0.1", "private"),
    ("172.31.255.254", "private"),
    ("192.168.1.1", "private"),
    ("fc00::1", "private"),
    ("fd12:3456::1", "private"),
    ("127.0.0.1", "loopback"),
    ("::1", "loopback"),
    ("224.0.0.1", "multicast"),
    ("ff02::1", "multicast"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("255.255.255.255", "reserved"),
    ("8.8.8.8", None),
    ("172.32.0.1", None),
    ("2606:4700::1111", None),
])
def test_addresses_are_classified(address, kind):
    assert safety.address_class(safety.parse_ip(address)) == kind


@pytest.mark.parametrize("address", ["169.254.169.254", "fd00:ec2::254", "169.254.1.1", "10.0.0.1",
                                     "192.168.0.10", "fc00::5", "127.0.0.1", "224.1.1.1", "0.0.0.0"])
def test_restricted_addresses_are_refused_without_an_allowlist(address):
    with pytest.raises(DomainError) as err:
        safety.check_address(address, [])
    assert err.value.code == "target_forbidden_address"
    assert address.split("::ffff:")[-1] in err.value.detail


def test_public_addresses_pass_and_loopback_passes_only_when_allowlisted():
    assert str(safety.check_address("8.8.8.8", [])) == "8.8.8.8"
    loopback = safety.parse_networks(["127.0.0.0/8"])
    assert str(safety.check_address("127.0.0.9", loopback)) == "127.0.0.9"
    with pytest.raises(DomainError):
        safety.check_address("::1", loopback)  # the IPv6 loopback is not in an IPv4 entry


def test_a_broad_link_local_entry_does_not_open_the_metadata_service():
    with pytest.raises(DomainError) as err:
        safety.check_address("169.254.169.254", safety.parse_networks(["169.254.0.0/16"]))
    assert err.value.code == "target_forbidden_address"
    assert str(safety.check_address("169.254.169.254", safety.parse_networks(["169.254.169.254/32"])))


def test_unspecified_and_multicast_are_never_allowed_even_under_a_catch_all_entry():
    everything = safety.parse_networks(["0.0.0.0/0", "::/0"])
    for address in ["0.0.0.0", "224.0.0.1", "::", "ff02::1"]:
        with pytest.raises(DomainError):
            safety.check_address(address, everything)


def test_ipv4_mapped_ipv6_cannot_smuggle_a_private_address():
    with pytest.raises(DomainError) as err:
        safety.check_address("::ffff:10.0.0.1", [])
    assert "10.0.0.1" in err.value.detail


# --- ownership (pure) -------------------------------------------------------------------------


def _listener(org_id: int, shared: bool = False) -> safety.ListenerFacts:
    return safety.ListenerFacts(id=7, lb_org_id=org_id, lb_shared=shared, protocol="http", port=80,
                                address="203.0.113.5")


def test_a_tenant_may_aim_only_at_its_own_lbs_or_its_claims_on_a_shared_one():
    claims = ["acme.example.com", "*.acme.test"]
    safety.check_listener_owned(org_id=1, is_operator=False, listener=_listener(1), hostname="", approved_claims=[])
    safety.check_listener_owned(org_id=1, is_operator=False, listener=_listener(9, shared=True),
                                hostname="api.acme.test", approved_claims=claims)
    for listener, hostname in [(_listener(2), ""), (_listener(9, shared=True), ""),
                               (_listener(9, shared=True), "globex.example.com"),
                               (_listener(9, shared=True), "*.acme.test")]:
        with pytest.raises(DomainError) as err:
            safety.check_listener_owned(org_id=1, is_operator=False, listener=listener, hostname=hostname,
                                        approved_claims=claims)
        assert err.value.code == "target_not_owned"
    safety.check_listener_owned(org_id=5, is_operator=True, listener=_listener(2), hostname="", approved_claims=[])


# --- caps (pure) ------------------------------------------------------------------------------

CAPS = safety.Caps(max_rate=1000, max_duration_s=60, max_concurrency=50)


def test_caps_name_every_limit_a_test_exceeds():
    with pytest.raises(DomainError) as err:
        safety.check_caps(safety.Load(peak_rate=1500, schedule_s=90, concurrency=80), CAPS)
    assert err.value.code == "cap_exceeded"
    assert "1500" in err.value.detail and "90" in err.value.detail and "80" in err.value.detail
    safety.check_caps(safety.Load(peak_rate=1000, schedule_s=60, concurrency=50), CAPS)


def test_runs_active_at_the_same_time_share_the_orgs_budget():
    active = [safety.Load(peak_rate=600, schedule_s=0, concurrency=20)]
    safety.check_budget(safety.Load(peak_rate=400, schedule_s=10, concurrency=30), active, CAPS)
    with pytest.raises(DomainError) as err:
        safety.check_budget(safety.Load(peak_rate=500, schedule_s=10, concurrency=10), active, CAPS)
    assert err.value.code == "cap_exceeded" and err.value.status == 409


def test_a_running_run_is_stopped_when_it_outgrows_its_caps():
    load = safety.Load(peak_rate=500, schedule_s=30, concurrency=20)

    def why(**kw):
        args = {"load": load, "caps": CAPS, "elapsed_s": 5.0, "drain_allowance_s": 6.0, "achieved_rates": []}
        return safety.running_violation(**{**args, **kw})

    assert why() is None
    assert "lowered" in why(caps=safety.Caps(max_rate=100, max_duration_s=60, max_concurrency=50))
    assert "duration cap" in why(elapsed_s=67.0)
    assert why(elapsed_s=65.0) is None  # inside the drain allowance
    assert why(achieved_rates=[400, 1300]) is None  # one burst sample is not a violation
    assert "rate cap" in why(achieved_rates=[1300, 1400])


# --- redirects (real sockets) ---------------------------------------------------------------------


class _Listener:
    """A loopback TCP server in a thread that counts connections and answers each request with `reply`."""

    def __init__(self, reply: bytes | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.reply = reply
        self.accepted = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        conn.settimeout(2)
        with conn:
            buffer = b""
            while not self.stopping.is_set():
                try:
                    data = conn.recv(4096)
                except OSError:
                    return
                if not data:
                    return
                buffer += data
                while b"\r\n\r\n" in buffer:
                    _, buffer = buffer.split(b"\r\n\r\n", 1)
                    if self.reply is not None:
                        conn.sendall(self.reply)

    def close(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=2)
        self.sock.close()


@pytest.fixture
def redirect_pair() -> Iterator[tuple[_Listener, _Listener]]:
    lure = _Listener(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    redirect = _Listener(f"HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:{lure.port}/\r\n"
                         "Content-Length: 0\r\n\r\n".encode())
    try:
        yield redirect, lure
    finally:
        redirect.close()
        lure.close()


def test_the_engine_never_follows_a_redirect_off_target(redirect_pair):
    redirect, lure = redirect_pair
    result = run_plan(LoadPlan.constant(Target("127.0.0.1", redirect.port, timeout_s=2.0), 50, 0.4))
    step = result.steps[0]
    assert step.ok == 0
    assert step.errors["non_2xx"] == step.sent == 20  # every 302 is an error, counted, not followed
    assert redirect.accepted >= 1
    assert lure.accepted == 0


# --- targets through the API (database) -------------------------------------------------------------


def _create(client, **fields):
    body = {"name": "t", "steps": [[10, 1]], **fields}
    return client.post("/api/v1/capacity-tests/", body, format="json")


@pytest.mark.django_db
def test_another_tenants_listener_is_refused_like_a_missing_one(world, alice):
    foreign = world.listener(9001, lb=world.globex_lb)
    refused = _create(alice.client, listener=foreign.pk)
    missing = _create(alice.client, listener=999_999)
    assert refused.status_code == missing.status_code == 400
    assert refused.json()["code"] == missing.json()["code"] == "target_not_owned"
    assert refused.json()["detail"].replace(str(foreign.pk), "N") == missing.json()["detail"].replace("999999", "N")
    assert not CapacityTest.objects.exists()


@pytest.mark.django_db
def test_on_a_shared_lb_only_the_tenants_own_claimed_hostname_may_be_loaded(world, alice):
    edge_listener = world.listener(9002, lb=world.edge)
    for hostname in ["", "globex.example.com", "unclaimed.example.com"]:
        response = _create(alice.client, listener=edge_listener.pk, hostname=hostname)
        assert response.status_code == 400, hostname
        assert response.json()["code"] == "target_not_owned"
        assert "hostname" in response.json()["fields"]
    ok = _create(alice.client, listener=edge_listener.pk, hostname="acme.example.com")
    assert ok.status_code == 201, ok.content


@pytest.mark.django_db
def test_another_tenants_route_is_refused(world, alice, globex):
    edge_listener = world.listener(9003, lb=world.edge)
    route = RouteFactory(lb=world.edge, org=globex, hosts=["globex.example.com"])
    response = _create(alice.client, listener=edge_listener.pk, route=route.pk)
    assert response.status_code == 400
    assert response.json()["code"] == "target_not_owned"


@pytest.mark.django_db
def test_private_and_loopback_listener_addresses_need_an_operator_allowlist(world, alice, otto, acme):
    private = StaticIP.objects.create(pool=world.vip.pool, address="10.20.0.5", state=StaticIP.State.ASSIGNED)
    listener = world.listener(9004, address=private)
    refused = _create(alice.client, listener=listener.pk)
    assert refused.status_code == 400
    assert refused.json()["code"] == "target_forbidden_address"
    assert "10.20.0.5" in refused.json()["detail"] and "private" in refused.json()["detail"]
    granted = otto.client.post("/api/v1/capacity-allowlist/",
                               {"org": "acme", "cidr": "10.20.0.0/24", "note": "acme's staging rig"}, format="json")
    assert granted.status_code == 201, granted.content
    assert _create(alice.client, listener=listener.pk).status_code == 201

    TargetAllowlist.objects.filter(cidr="127.0.0.0/8").delete()
    loopback = world.listener(9005)
    response = _create(alice.client, name="loop", listener=loopback.pk)
    assert response.status_code == 400
    assert response.json()["code"] == "target_forbidden_address"


@pytest.mark.django_db
def test_external_targets_need_an_allowlist_entry_for_the_tenant(world, alice, charlie, otto):
    response = _create(alice.client, address="198.51.100.7", port=80)
    assert response.status_code == 400 and response.json()["code"] == "target_not_owned"
    entry = otto.client.post("/api/v1/capacity-allowlist/", {"org": "acme", "cidr": "198.51.100.0/24",
                                                             "ports": "80,8000-8099"}, format="json")
    assert entry.status_code == 201
    # The entry names its ports: the same host on another port is not a target.
    other_port = _create(alice.client, name="db", address="198.51.100.7", port=5432)
    assert other_port.status_code == 400 and other_port.json()["code"] == "target_not_owned"
    created = _create(alice.client, address="198.51.100.7", port=80)
    assert created.status_code == 201, created.content
    # The entry is acme's: globex may not borrow it.
    response = _create(charlie.client, address="198.51.100.7", port=80)
    assert response.status_code == 400 and response.json()["code"] == "target_not_owned"


@pytest.mark.django_db
def test_a_hostname_resolving_to_a_forbidden_address_is_refused(world, alice, otto):
    # "localhost" resolves to loopback: allowlisting the *name* does not lift the address rule for ::1.
    otto.client.post("/api/v1/capacity-allowlist/", {"hostname": "localhost", "ports": "8080",
                                                     "applies_to_all_orgs": True}, format="json")
    TargetAllowlist.objects.filter(cidr="127.0.0.0/8").delete()
    response = _create(alice.client, address="localhost", port=8080)
    assert response.status_code == 400
    assert response.json()["code"] == "target_forbidden_address"


@pytest.mark.django_db
def test_tests_over_the_orgs_caps_are_refused_at_creation(world, alice, acme):
    listener = world.listener(9006)
    acme.max_test_rate, acme.max_test_duration_s, acme.max_test_concurrency = 500, 30, 20
    acme.save()
    for fields, needle in [({"steps": [[100, 5], [600, 5]]}, "600 req/s"),
                           ({"steps": [[100, 20], [200, 20]]}, "duration 40"),
                           ({"mode": "closed", "steps": [[50, 5]]}, "concurrency 50"),
                           ({"steps": [[100, 5]], "max_connections": 21}, "concurrency 21")]:
        response = _create(alice.client, listener=listener.pk, **fields)
        assert response.status_code == 400, fields
        assert response.json()["code"] == "cap_exceeded"
        assert needle in response.json()["detail"].lower()


@pytest.mark.django_db
def test_starting_is_refused_when_active_runs_already_use_the_budget(world, alice, acme):
    acme.max_test_rate = 300
    acme.save()
    listener = world.listener(9007)
    test = _create(alice.client, listener=listener.pk, steps=[[200, 5]], max_connections=50).json()
    assert alice.client.post(f"/api/v1/capacity-tests/{test['id']}/start/").status_code == 201
    second = alice.client.post(f"/api/v1/capacity-tests/{test['id']}/start/")
    assert second.status_code == 409
    assert second.json()["code"] == "cap_exceeded"
    assert "400 req/s" in second.json()["detail"]


@pytest.mark.django_db
def test_caps_lowered_after_creation_are_enforced_at_start(world, alice, acme):
    listener = world.listener(9008)
    test = _create(alice.client, listener=listener.pk, steps=[[200, 5]]).json()
    acme.max_test_rate = 100
    acme.save()
    response = alice.client.post(f"/api/v1/capacity-tests/{test['id']}/start/")
    assert response.status_code == 400
    assert response.json()["code"] == "cap_exceeded"


@pytest.mark.django_db
def test_a_loopback_allowlist_does_not_open_the_control_planes_own_services(world, alice, otto):
    """The demo allowlists 127.0.0.0/8 so tests reach its fleet's listeners: with no ports named, that
    entry must not let a tenant aim at PostgreSQL or Redis on the same machine by address."""
    TargetAllowlist.objects.filter(cidr="127.0.0.0/8").update(ports="")
    for port in (5432, 6379):
        response = _create(alice.client, name=f"p{port}", address="127.0.0.1", port=port)
        assert response.status_code == 400 and response.json()["code"] == "target_not_owned", response.content
    assert _create(alice.client, name="own", listener=world.listener(9011).pk).status_code == 201


@pytest.mark.django_db
def test_a_test_by_address_cannot_carry_another_tenants_hostname(world, alice, charlie, otto):
    """GIVEN an address acme may load, WHEN acme sets Host to globex's claimed name THEN it is refused:
    on a shared LB the Host header decides whose routes take the load."""
    from tests.factories import HostnameClaimFactory

    HostnameClaimFactory(org=charlie.org, hostname="shop.globex.test", status="approved")
    HostnameClaimFactory(org=alice.org, hostname="shop.acme.test", status="approved")
    theirs = _create(alice.client, name="theirs", address="127.0.0.1", port=9012, hostname="shop.globex.test")
    mine = _create(alice.client, name="mine", address="127.0.0.1", port=9012, hostname="shop.acme.test")

    assert theirs.status_code == 400 and theirs.json()["code"] == "target_not_owned"
    assert "globex" not in theirs.json()["detail"].replace("shop.globex.test", "")
    assert mine.status_code == 201, mine.content


@pytest.mark.django_db
def test_a_listener_served_by_nodes_with_their_own_bind_address_is_loaded_where_they_listen(world, alice):
    """The demo fleet's nodes listen on 127.0.0.x, not on the listener's static IP: load goes to a node
    of the tested region, not at an address where nothing listens."""
    from apps.capacity.models import CapacityTest
    from apps.capacity.safety import target_resolve
    from apps.fleets.models import Fleet, Node

    listener = world.listener(9006)
    other = RegionFactory(slug="eu-west")
    for name, region, bind in (("f-eu", other, "127.0.0.8"), ("f-us", world.pool_region.region, "127.0.0.7")):
        fleet = Fleet.objects.create(name=name, region=region)
        fleet.serves.add(listener.lb)
        Node.objects.create(fleet=fleet, name="n1", address="127.0.0.1", runtime_dir=f"/tmp/{name}",
                            config_dir=f"/tmp/{name}/etc", bind_address=bind)
    created = _create(alice.client, name="via-nodes", listener=listener.pk, region="us-east")
    assert created.status_code == 201, created.content
    target = target_resolve(test=CapacityTest.objects.get(pk=created.json()["id"]))
    assert (target.address, target.port) == ("127.0.0.7", 9006)
