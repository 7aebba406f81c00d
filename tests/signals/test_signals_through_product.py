"""Golden signals through the product: a real Celery worker rolls the config out to real HAProxy nodes, which
send their request log to the real collector (`manage.py runsignals`, its own process) while real traffic runs.
A route whose backend answers 500 and a member that answers slowly are seen in the API, on the pages (real
Chromium), at that route and that member and nowhere else, and the counts equal the nodes' own counters."""

from __future__ import annotations

import threading

import pytest
from rest_framework.test import APIClient

from apps.accounts.models import Organization, Role
from apps.accounts.services import token_create, user_create_with_membership
from apps.balancers.models import Member, Region
from apps.fleets import queries, services
from apps.fleets.models import Fleet, Rollout
from apps.fleets.node.outside_rollout import read_state
from tests.browser import SHOTS, login, shot
from tests.fleets.fleetkit import add_pool, add_route, changed, make_local_fleet
from tests.netutil import free_udp_port
from tests.processes import process_env, start_python, stop_process
from tests.signals.signalkit import address_of, slow_backend
from tests.waiting import wait_until

pytestmark = [pytest.mark.haproxy, pytest.mark.browser, pytest.mark.django_db(transaction=True)]
SLOW_S = 1.0
# A healthy member's or route's p99 stays under half the slow member's delay. The backends are Python servers in
# the test process: on a loaded 2-core machine (four test workers) an unhurried route measured 128 ms once and
# 391 ms once (CPU loop 2.1x the reference's, 2026-11-29), past the 250 ms a 0.5 s delay gave.
FAST_MS = SLOW_S * 1000 / 2


def test_a_failing_route_and_a_slow_member_show_where_they_are_and_nowhere_else(
        page, haproxy_bin, tmp_path, live_server, celery_worker_factory):
    ok, fast, slow, broken, hold = (slow_backend("ok"), slow_backend("fast"), slow_backend("slow", delay_s=SLOW_S),
                                    slow_backend("broken", status=500), slow_backend("hold", delay_s=3.0))
    port = free_udp_port()
    collector = start_python(["manage.py", "runsignals", "--listen", f"127.0.0.1:{port}"],
                             process_env(SPILLWAY_SIGNALS_STATS_S="2"), tmp_path / "collector.log")
    local = make_local_fleet(name="sig", subnet=93, node_count=2, backend_address=address_of(ok))
    try:
        local.fleet.signals_target = f"127.0.0.1:{port}"
        local.fleet.save(update_fields=["signals_target"])
        lb = local.lb
        api_pool = add_pool(lb, "api", address_of(fast))
        Member.objects.create(pool=api_pool, region=Region.objects.get(slug="us-east"), name="api-2",
                              address=address_of(slow)[0], port=address_of(slow)[1])
        bad_pool = add_pool(lb, "bad", address_of(broken))
        ok_route = add_route(lb, local.listener.default_pool, "/ok", 10)
        api_route = add_route(lb, api_pool, "/api", 20)
        bad_route = add_route(lb, bad_pool, "/bad", 30)
        hold_pool = add_pool(lb, "hold", address_of(hold))
        add_route(lb, hold_pool, "/hold", 40)
        # A line sent before the collector listens is lost (UDP): wait for it, as an operator starts it first.
        wait_until(lambda: b"listening on" in (tmp_path / "collector.log").read_bytes(), timeout_s=20)
        # A real worker rolls the routes out, as a change made through the API has it do.
        celery_worker_factory()
        changed(local.fleet)
        services.request_reconcile(local.fleet.pk)

        def rolled_out() -> bool:
            fleet = Fleet.objects.get(pk=local.fleet.pk)
            return fleet.desired_revision > 0 and all(
                n.applied_revision is not None and n.applied_revision.number == fleet.desired_revision
                for n in local.nodes) and not Rollout.objects.filter(fleet=fleet, status__in=Rollout.ACTIVE).exists()

        wait_until(rolled_out, timeout_s=60, what="the worker's rollout on every node")
        nodes = local.nodes
        assert [local.get(n, "/ok")[1] for n in nodes] == ["ok", "ok"]

        sent = {"/ok": len(nodes), "/api/items": 0, "/bad": 0}  # with the requests that checked the rollout
        statuses = {"/ok": set(), "/api/items": set(), "/bad": set()}
        wait_until(lambda: bool(queries.node_regions()), timeout_s=5)
        for round_ in range(12):
            for node in nodes:
                for path in sent:
                    status, _ = local.get(node, f"{path}?n={round_}")
                    sent[path] += 1
                    statuses[path].add(status)
        # A path longer than any log line HAProxy would have cut (2 KB before): counted as any other request.
        status, _ = local.get(nodes[0], "/ok/" + "x" * 6000)
        sent["/ok"] += 1
        statuses["/ok"].add(status)
        assert statuses == {"/ok": {200}, "/api/items": {200}, "/bad": {500}}
        total_sent = sum(sent.values())

        ops = Organization.objects.get(slug="ops")
        olga = user_create_with_membership(username="olga", password="olga-pass-123", org=ops, role=Role.ADMIN)
        client = APIClient()
        secret = token_create(org=ops, name="olga-read", scopes=["read"], user=olga).secret
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {secret}")

        def chart(scope: str, pk: int) -> dict:
            answer = client.get("/api/v1/signals/", {"scope": scope, "id": pk, "range": "5m"})
            assert answer.status_code == 200, answer.content
            return answer.json()

        # Within seconds of the last request, every one is counted (the collector writes every second).
        routes = ((ok_route, "/ok"), (api_route, "/api/items"), (bad_route, "/bad"))
        wait_until(lambda: all(chart("route", r.pk)["totals"]["requests"] >= sent[p] for r, p in routes),
                   timeout_s=15, what="every request counted at its route")
        lb_totals = chart("lb", lb.pk)["totals"]
        seconds = lb_totals["requests"] / lb_totals["rate"]
        # The frontend also counts connections that closed before sending a request (a port probe): 400s.
        assert round((lb_totals["rate_2xx"] + lb_totals["rate_5xx"]) * seconds) == total_sent

        bad = chart("route", bad_route.pk)["totals"]
        assert bad["requests"] == sent["/bad"] and bad["error_ratio"] == 1.0
        assert bad["rate_backend_5xx"] > 0 and bad["rate_proxy_5xx"] == 0  # the backend's own 500s
        for route, path in ((ok_route, "/ok"), (api_route, "/api/items")):
            totals = chart("route", route.pk)["totals"]
            assert totals["requests"] == sent[path] and totals["error_ratio"] == 0.0, (path, totals)

        api = chart("pool", api_pool.pk)
        members = {m["name"]: m["signals"] for m in api["members"]}
        assert members["api-2"]["upstream_p99_ms"] >= SLOW_S * 1000 * 0.85
        assert members["api-1"]["upstream_p99_ms"] < FAST_MS
        assert members["api-1"]["requests"] + members["api-2"]["requests"] == sent["/api/items"]
        assert chart("route", ok_route.pk)["totals"]["total_p99_ms"] < FAST_MS  # the slow member is not ok's
        assert chart("pool", bad_pool.pk)["members"][0]["signals"]["error_ratio"] == 1.0

        # The nodes' own counters: each frontend's requests and each server's 5xx.
        frontend_total, server_5xx = 0, {}
        for node in nodes:
            state = read_state(queries.node_conn(node), with_stats=True)
            for row in state.stats:
                if row.svname == "FRONTEND" and row.pxname == f"fe_{lb.name}.http":
                    frontend_total += row.req_tot or 0
                elif row.is_server:
                    server_5xx[row.svname] = server_5xx.get(row.svname, 0) + int(row.raw.get("hrsp_5xx") or 0)
        assert frontend_total == lb_totals["requests"]
        assert server_5xx["bad-1"] == bad["requests"] and server_5xx["api-2"] == server_5xx["old-1"] == 0

        # The requests behind the number: the sampled log has the bad route's 500s, and nothing of the others'.
        sampled = client.get("/api/v1/signals/requests/", {"scope": "route", "id": bad_route.pk}).json()["requests"]
        assert sampled and {(r["status"], r["path"].split("?")[0], r["by_proxy"]) for r in sampled} == {
            (500, "/bad", False)}
        assert {r["node"] for r in sampled} <= {str(n) for n in nodes}

        # On the pages.
        login(page, "olga", "olga-pass-123")
        page.goto(f"{live_server.url}/routes/{bad_route.pk}/")
        page.get_by_test_id("signals-5xx").filter(has_text="100.0%").wait_for()
        page.locator(".signals-chart canvas").first.wait_for()
        shot(page, "signals-route-5xx")
        page.get_by_test_id("signals-requests-link").click()
        rows = page.locator("[data-testid=requests-table] tbody tr")
        rows.first.wait_for()
        assert rows.count() == len(sampled) and set(rows.evaluate_all("rs => rs.map(r => r.dataset.status)")) == {"500"}
        shot(page, "signals-sampled-requests")
        page.go_back()
        page.goto(f"{live_server.url}/routes/{ok_route.pk}/")
        page.get_by_test_id("signals-5xx").filter(has_text="0.0%").wait_for()
        page.goto(f"{live_server.url}/traffic/pools/{api_pool.pk}/")
        slow_row = page.locator("[data-testid=signals-members] tr[data-member=api-2]")
        slow_row.wait_for()
        slow_p99 = int(slow_row.locator("td").nth(4).inner_text().split()[0])
        fast_p99 = int(page.locator("[data-testid=signals-members] tr[data-member=api-1] td").nth(4)
                       .inner_text().split()[0])
        assert slow_p99 >= SLOW_S * 1000 * 0.85 and fast_p99 < FAST_MS
        page.locator(".signals-chart canvas").first.wait_for()
        shot(page, "signals-pool-slow-member")
        page.goto(f"{live_server.url}/")
        worst = page.locator("[data-testid=top-routes-errors] tbody tr").first
        assert worst.get_attribute("data-route") == str(bad_route.pk) and "100.0%" in worst.inner_text()
        slowest = page.locator("[data-testid=top-routes-latency] tbody tr").first
        assert slowest.get_attribute("data-route") == str(api_route.pk)  # the slow member's route
        page.locator("#top-routes").screenshot(path=str(SHOTS / "signals-dashboard-top-routes.png"))
        page.goto(f"{live_server.url}/load-balancers/{lb.pk}/")
        page.get_by_test_id("signals-totals").filter(has_text=f"{lb_totals['requests']} requests").wait_for()
        shot(page, "signals-lb")

        # Active sessions as the nodes count them (`show stat` scur, read by the health loop): three requests held
        # open at a slow member are three sessions on the pool's chart.
        holders = [threading.Thread(target=local.get, args=(nodes[0], "/hold")) for _ in range(3)]
        for holder in holders:
            holder.start()
        # Collected once all three are at the backend (a loaded machine may take a moment to send them).
        wait_until(lambda: hold.in_flight == 3, timeout_s=2.5, what="three requests held at the backend")  # type: ignore[attr-defined]
        services.fleet_health_collect(fleet=local.fleet)
        for holder in holders:
            holder.join()
        held = [v for v in chart("pool", hold_pool.pk)["series"]["sessions"] if v is not None]
        assert held and max(held) == 3, held
        assert max(v for v in chart("pool", api_pool.pk)["series"]["sessions"] if v is not None) == 0
        page.goto(f"{live_server.url}/traffic/pools/{hold_pool.pk}/")
        page.locator("[data-chart=sessions] canvas").wait_for()
        shot(page, "signals-pool-sessions")
    finally:
        local.stop_all()
        stop_process(collector)
        for server in (ok, fast, slow, broken, hold):
            server.shutdown()
            server.server_close()
