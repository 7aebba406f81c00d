"""Overflow UI: overview, live panel (htmx partial), timeline data, what-if form, tenancy."""

from __future__ import annotations

import json
import re

import pytest

from tests.personas import web
from tests.traffic.traffickit import record_steady_load

pytestmark = pytest.mark.django_db


def test_overview_lists_the_tenant_s_pools_with_capacity_per_region(alice, charlie, two_regions) -> None:
    page = web(alice).get("/traffic/")
    assert page.status_code == 200
    text = page.content.decode()
    assert f"/traffic/pools/{two_regions.pool.pk}/" in text and "ra: 20.0/s (2)" in text
    assert f"/traffic/pools/{two_regions.pool.pk}/" not in web(charlie).get("/traffic/").content.decode()


def test_pool_page_shows_bars_per_region_and_carries_the_timeline(alice, two_regions) -> None:
    pool = two_regions.pool
    record_steady_load(pool.pk, a_local=20.0, a_out=10.0, b_local=5.0)
    page = web(alice).get(f"/traffic/pools/{pool.pk}/")
    assert page.status_code == 200
    text = page.content.decode()
    for label in ("capacity", "demand", "served locally", "overflow out", "overflow in"):
        assert label in text
    assert "→ rb 10.0/s" in text and "← ra 10.0/s" in text
    assert 'hx-trigger="every 5s"' in text and "style=" not in text  # CSP: widths come from traffic.js
    series = json.loads(re.search(r'<script id="overflow-series" type="application/json">(.*?)</script>',
                                  text, re.S).group(1))
    assert series["time"] and set(series["regions"]) == {"ra", "rb"}
    assert 'name="max_rate_per_member_ra"' in text


def test_panel_partial_is_what_htmx_polls(alice, two_regions) -> None:
    panel = web(alice).get(f"/traffic/pools/{two_regions.pool.pk}/panel/?window=1h", HTTP_HX_REQUEST="true")
    assert panel.status_code == 200
    text = panel.content.decode()
    assert "<html" not in text and "Over the last 1h" in text and 'id="overflow-series"' in text


def test_what_if_form_answers_with_the_plan_beside_today_s(bob, two_regions) -> None:
    form = {"healthy_members_ra": "2", "max_rate_per_member_ra": "20", "capacity_scaler_ra": "1",
            "demand_ra": "50", "healthy_members_rb": "2", "max_rate_per_member_rb": "20",
            "capacity_scaler_rb": "1", "demand_rb": "0", "policy": "waterfall"}
    result = web(bob).post(f"/traffic/pools/{two_regions.pool.pk}/what-if/", form, HTTP_HX_REQUEST="true")
    assert result.status_code == 200
    text = result.content.decode()
    assert "Proposed plan" in text and "→rb 10.0" in text  # 40 local, 10 out; today 20 local, 30 out
    assert "20.0 / 30.0" in text


def test_what_if_form_shows_errors_next_to_the_form(alice, two_regions) -> None:
    result = web(alice).post(f"/traffic/pools/{two_regions.pool.pk}/what-if/",
                                 {"capacity_scaler_ra": "0.05"}, HTTP_HX_REQUEST="true")
    assert result.status_code == 200 and 'role="alert"' in result.content.decode()
    assert "capacity_scaler" in result.content.decode()


def test_outsiders_get_404_on_every_pool_page(charlie, two_regions) -> None:
    client, pk = web(charlie), two_regions.pool.pk
    assert client.get(f"/traffic/pools/{pk}/").status_code == 404
    assert client.get(f"/traffic/pools/{pk}/panel/").status_code == 404
    assert client.post(f"/traffic/pools/{pk}/what-if/", {}).status_code == 404


def test_what_if_shows_the_per_node_shares_that_follow_demand(bob, two_regions) -> None:
    from apps.fleets.models import Fleet, Node

    for region, name in ((two_regions.a, "fa"), (two_regions.b, "fb")):
        fleet = Fleet.objects.create(name=name, region=region)
        fleet.serves.add(two_regions.lb)
        for n in ("n1", "n2"):
            Node.objects.create(fleet=fleet, name=n, address="127.0.0.1", runtime_dir=f"/tmp/{name}{n}",
                                config_dir=f"/tmp/{name}{n}/etc")
    form = {"healthy_members_ra": "2", "max_rate_per_member_ra": "20", "capacity_scaler_ra": "1",
            "demand_ra": "50", "healthy_members_rb": "2", "max_rate_per_member_rb": "20",
            "capacity_scaler_rb": "1", "demand_rb": "0", "policy": "waterfall"}
    text = web(bob).post(f"/traffic/pools/{two_regions.pool.pk}/what-if/", form,
                             HTTP_HX_REQUEST="true").content.decode()
    assert "in\nproportion to the demand that node receives" in text or "proportion to the demand" in text
    # 50 req/s spread over ra's two nodes: each gets half of ra's 40 and half of the 10 that overflow.
    assert "fa/n1: ra &lt;20/s → rb &lt;5/s" in text, text
    # The planner's split (40 local / 10 out) is what the nodes enforce.
    assert "40.0 / 10.0" in text
