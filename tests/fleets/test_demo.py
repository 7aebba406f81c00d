"""The demo fleet `make run` starts: 2 regions x 2 real HAProxy nodes serving the demo LB."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from apps.balancers import demo as balancers_demo
from apps.core import ports
from apps.events.models import Event
from apps.fleets import demo
from apps.fleets.models import Fleet, Node, Rollout
from apps.fleets.rollout import drift
from tests import readme
from tests.netutil import http_get

pytestmark = [pytest.mark.haproxy, pytest.mark.django_db]


def test_the_demo_fleet_starts_serves_both_regions_and_stops(haproxy_bin, demo_fleet_addresses, settings,
                                                             tmp_path) -> None:
    settings.VAR_DIR = tmp_path / "var"
    balancers_demo.load_demo()
    assert "2 regions x 2" in demo.load_demo()
    demo.load_demo()  # idempotent
    assert Fleet.objects.filter(name__startswith="demo-").count() == 2
    assert Node.objects.count() == 4
    try:
        message = demo.start_demo_processes()
        assert "demo fleet: 4/4 HAProxy nodes serving `edge`" in message, message
        assert set(Rollout.objects.values_list("status", flat=True)) == {"succeeded"}
        us = http_get("http://127.0.40.2:8080/", headers={"Host": "acme.example.com"})
        eu = http_get("http://127.0.41.1:8080/", headers={"Host": "globex.example.com"})
        assert us[0] == 200 and us[1].startswith("acme-us-east-")
        assert eu == (200, "globex-eu-west-1 /\n")
        # README.md's curl, as written (tests/test_readme.py counts on this test running it).
        curl = subprocess.run(shlex.split(readme.command("curl ")), capture_output=True, text=True, timeout=30)
        assert curl.returncode == 0 and curl.stdout.startswith("acme-us-east-"), curl

        # `make run` again (the nodes' configs are still on disk): fresh masters, verified again, and the
        # drift check finds nothing to report (not "reloaded outside Spillway" on every node).
        demo.stop_demo_processes()
        assert "demo fleet: 4/4 HAProxy nodes serving `edge`" in demo.start_demo_processes()
        for fleet in Fleet.objects.filter(name__startswith="demo-"):
            report = drift.fleet_drift_report(fleet=fleet)
            assert (report.checked, report.drifted, report.down) == (2, {}, []), report
        assert Event.objects.filter(type__startswith="drift.").count() == 0
    finally:
        demo.stop_demo_processes()
    assert ports.is_free("127.0.40.1", 8080) and ports.is_free("127.0.20.1", 9101)


def test_without_haproxy_the_demo_says_so(settings) -> None:
    settings.HAPROXY_BIN = "/nonexistent/haproxy"
    assert demo.start_demo_processes() == "haproxy not installed: demo fleet not started"


def test_nodes_that_did_not_take_the_rollout_are_not_reported_as_serving(settings, tmp_path) -> None:
    settings.VAR_DIR = tmp_path / "var"
    balancers_demo.load_demo()
    demo.load_demo()
    fleets = list(Fleet.objects.filter(name__startswith="demo-"))
    message = demo._serving_message(fleets, [])  # nothing rolled out: nothing serves
    assert message.startswith("demo fleet NOT serving: 0/4 HAProxy nodes took the roll-out")
    Node.objects.filter(address="127.0.41.1").update(status=Node.Status.DOWN,
                                                      status_detail="reload failed\nbind conflict on 127.0.41.1:8080")
    message = demo._serving_message(fleets, [])
    assert "not serving: demo-eu-west/n1 (127.0.41.1): bind conflict on 127.0.41.1:8080" in message
    assert "serving `edge`" not in message
