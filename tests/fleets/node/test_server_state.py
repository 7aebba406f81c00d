"""The server-state file keeps drains and weights across a reload, and never a member's old address: HAProxy
applies a saved port over the config's (haproxy/haproxy#985), so a member moved to another port went on
being served at the old one after the reload that was to move it."""

from __future__ import annotations

import pytest

from apps.balancers.models import Member
from apps.fleets.node.transports.base import config_server_addresses, state_without_moved_servers
from tests.fleets.fleetkit import make_local_fleet, reconcile
from tests.signals.signalkit import address_of, slow_backend

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db(transaction=True)]

STATE = """1
# be_id be_name srv_id srv_name srv_addr srv_op_state srv_admin_state srv_uweight srv_iweight (and 16 more)
3 p1_us-east 1 a 10.0.0.1 2 8 50 100 12 1 0 0 0 0 0 0 - 8080 - 0 0 - - 0
3 p1_us-east 2 b 10.0.0.2 2 0 100 100 12 1 0 0 0 0 0 0 - 8080 - 0 0 - - 0
4 p2_us-east 1 c ::1 2 0 100 100 12 1 0 0 0 0 0 0 - 9000 - 0 0 - - 0
"""
CONFIG = """global
    log stdout format raw local0

backend p1_us-east
    balance roundrobin
    server a 10.0.0.1:8080 weight 100

    server b 10.0.0.2:8081 weight 100

backend p2_us-east
    server c [::1]:9000
"""


def test_a_server_whose_port_or_address_moved_leaves_the_state_file_and_the_others_keep_theirs():
    assert config_server_addresses(CONFIG) == {("p1_us-east", "a"): ("10.0.0.1", "8080"),
                                               ("p1_us-east", "b"): ("10.0.0.2", "8081"),
                                               ("p2_us-east", "c"): ("::1", "9000")}
    kept = state_without_moved_servers(STATE, CONFIG).splitlines()
    assert [line.split()[3] for line in kept[2:]] == ["a", "c"]  # b moved to 8081: left to the config
    assert kept[:2] == STATE.splitlines()[:2]


def test_a_member_moved_to_another_port_is_served_there_after_the_reload(haproxy_bin):
    old, new = slow_backend("old"), slow_backend("new")
    local = make_local_fleet(name="mv", subnet=95, node_count=1, backend_address=address_of(old))
    try:
        reconcile(local.fleet)
        node = local.nodes[0]
        assert local.get(node)[1] == "old"
        member = Member.objects.get(pool__lb=local.lb)
        member.port = address_of(new)[1]
        member.save()
        reconcile(local.fleet)  # a reload (a server line moved), after the state file was written
        assert local.get(node)[1] == "new"
    finally:
        local.stop_all()
        for server in (old, new):
            server.shutdown()
            server.server_close()
