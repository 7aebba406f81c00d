"""The demo's `edge-knee` capacity test, as `make run` sets it up, through a real Celery worker and fleet, then
applied in a real browser (issue 35's workflow 5: a capacity test's recommendation applied with care).

`manage.py loaddemo` defines the test (acme's pool on the shared `edge` LB, region us-east, 2 shards);
`start_demo_processes` starts the 4 demo HAProxy nodes and backends and rolls them out; a real worker
with `make run`'s 2 slots runs the run. What the nodes served is read from their own `show stat`.
"""

from __future__ import annotations

import re
import warnings

import pytest
from django.core.management import call_command

from apps.balancers.demo import DEMO_PASSWORDS
from apps.balancers.models import Pool, PoolRegion
from apps.capacity import knee
from apps.capacity.models import CapacityRun, CapacityTest
from apps.capacity.services import capacity_run_start
from apps.fleets import demo
from apps.fleets import selectors as fleet_selectors
from apps.fleets.config.render.chain import LIMITS_MAP, backend_name
from apps.fleets.models import Node
from apps.fleets.node.runtime_api import HAProxySocket
from apps.fleets.node.showstat import parse_show_stat
from apps.traffic.selectors import pool_capacities
from tests.browser import login, shot
from tests.capacity.capacitykit import stalled_not_queued, wait_for_run
from tests.netutil import http_get
from tests.waiting import wait_for

pytestmark = [pytest.mark.haproxy, pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def _served(nodes: list[Node], backends: list[str]) -> dict[str, int]:
    """Requests each backend has been sent (`stot`), summed over the nodes."""
    out = dict.fromkeys(backends, 0)
    for node in nodes:
        rows = parse_show_stat(HAProxySocket(fleet_selectors.node_conn(node).stats_socket_path).command("show stat"))
        for row in rows:
            if row.svname == "BACKEND" and row.pxname in out:
                out[row.pxname] += int(row.raw.get("stot") or 0)
    return out


def _limits(nodes: list[Node], backend: str) -> set[int]:
    """The per-node rate limit each node enforces now for one backend (its live chain limits map)."""
    found = set()
    for node in nodes:
        entries = dict(HAProxySocket(fleet_selectors.node_conn(node).stats_socket_path).show_map(LIMITS_MAP))
        found.add(int(entries[backend]))
    return found


def _measure(test: CapacityTest, us_nodes: list[Node], backends: list[str]) -> tuple[CapacityRun, int, int]:
    """Run the test once; the run, and what us-east's and eu-west's backends were sent meanwhile."""
    before = _served(us_nodes, backends)
    run = wait_for_run(capacity_run_start(principal=None, test=test).pk, timeout_s=60.0)
    after = _served(us_nodes, backends)
    local, overflow = (after[b] - before[b] for b in backends)
    return run, local, overflow


def _stalled(run: CapacityRun) -> bool:
    """The knee came early with a stall's signature, not a queue's: the step that missed (40 or 80 req/s) was
    served in full and its median stayed where the step below's was; only the tail missed. A real knee moves the
    median too (requests queue), as the 160 req/s step's does (p50 ~1 s). A whole suite saw the stall in either:
    80 req/s (knee at 40), and 40 req/s at p99 244 ms with 80 at p99 211 ms (knee at 20)."""
    if run.knee_step_index not in (0, 1):
        return False
    steps = _merged_steps(run)
    missed = run.knee_step_index + 1
    if len(steps) <= missed:
        return False  # the assertions on the run say what is missing
    return stalled_not_queued(steps[missed], steps[run.knee_step_index].p50_ms)


def _merged_steps(run: CapacityRun) -> list:
    """The run's steps as all its shards measured them together, lowest rate first."""
    return list(run.step_results.filter(shard__isnull=True).order_by("index"))


def _steps(run: CapacityRun) -> list[str]:
    """Each merged step as one line (offered, achieved, p50/p99/max), for a failure's message."""
    return [f"{s.offered_rate:g} req/s: achieved {s.achieved_rate:.1f}, p50 {s.p50_ms:.0f} p99 {s.p99_ms:.0f} "
            f"max {s.max_ms:.0f} ms" for s in _merged_steps(run)]


@pytest.mark.quiet
def test_the_demo_edge_knee_test_measures_us_east_of_the_demo_fleet_through_a_worker(
        haproxy_bin, demo_fleet_addresses, celery_worker_factory, settings, tmp_path, page) -> None:
    """GIVEN `make run`'s demo (loaddemo, the demo fleet started, a worker with 2 slots)
    WHEN acme's `edge-knee` test runs
    THEN it aims where a us-east node listens (not the listener's static IP, where nothing listens);
    us-east's members serve every request it sent and eu-west's none (overflow held off, so what it
    measures is us-east's own); it finds the knee the demo backends document (2 members x 60 req/s: the
    80 req/s step holds the SLO, 160 does not); and the recommendation divides by the 2 members that served."""
    settings.VAR_DIR = tmp_path / "var"
    call_command("loaddemo", verbosity=0)
    test = CapacityTest.objects.get(org__slug="acme", name="edge-knee")
    pool = Pool.objects.get(pk=test.pool_id)
    worker_env = {"SPILLWAY_VAR_DIR": str(settings.VAR_DIR)}
    try:
        message = demo.start_demo_processes()
        assert "4/4 HAProxy nodes serving `edge`" in str(message), message
        celery_worker_factory("demo", concurrency=2, **worker_env)
        us_nodes = list(Node.objects.filter(fleet__name="demo-us-east").order_by("name"))
        backends = [backend_name(pool.pk, "us-east", "http"), backend_name(pool.pk, "eu-west", "http")]
        run, local, overflow = _measure(test, us_nodes, backends)
        if _stalled(run):
            # One ~0.4 s stall of this shared 2-core machine (CI saw one: p50 17 ms, p99 386 ms at 80 req/s,
            # every request answered) fails a step that the backends serve easily. The run judged right on
            # what it measured; this test is about where the demo's knee is, so it measures once more.
            warnings.warn(f"demo knee: a stall's signature, measured again: {_steps(run)}", stacklevel=1)
            run, local, overflow = _measure(test, us_nodes, backends)
        assert run.status == CapacityRun.Status.SUCCEEDED, (run.error_code, run.error)

        # The tenant applies it in the browser: the preview says before -> after and asks; the nodes take it.
        limits_before = _limits(us_nodes, backends[0])
        login(page, "acme", DEMO_PASSWORDS["acme"])
        page.goto(f"/capacity/runs/{run.pk}/")
        page.get_by_role("button", name="Apply to the pool…").click()
        preview = page.locator("#apply-preview")
        preview.wait_for()
        shot(page, "capacity-apply-preview-real-run")
        shown = re.search(r"us-east capacity: ([\d.]+) req/s → ([\d.]+) req/s", preview.inner_text())
        assert shown, preview.inner_text()
        capacity_before, capacity_after = float(shown.group(1)), float(shown.group(2))
        members = run.healthy_members
        assert capacity_before == pytest.approx(members * pool.regions.get(region__slug="us-east").max_rate_per_member)
        assert capacity_after == pytest.approx(members * run.recommended_max_rate_per_member, abs=0.05)
        preview.get_by_role("button", name="Apply", exact=True).click()
        page.locator("#run-recommendation .badge", has_text="applied").wait_for()
        shot(page, "capacity-applied-real-run")
        pool_region = PoolRegion.objects.get(pool=pool, region__slug="us-east")
        assert pool_region.max_rate_per_member == run.recommended_max_rate_per_member
        capacity = {c.region: c.capacity for c in pool_capacities(pool)}
        assert capacity["us-east"] == pytest.approx(capacity_after, abs=0.05)  # what the preview said it would be
        # The demo's pool has members in eu-west too, so the us-east nodes' chain is us-east then eu-west: once the
        # new capacity is rolled out, each us-east node enforces its share of it (no enforcer runs here: the rendered
        # share, the capacity over the region's nodes). Read before the rollout reached the nodes, this test used to
        # see the old value and claimed "no limit"; after it, it saw the new share.
        # Waiting for the nodes to reach the fleet's desired revision was not enough: read before the new capacity's
        # render, that revision was still the old one (a run of the whole suite saw "no limit" once).
        share = capacity_after / len(us_nodes)

        def enforcing_the_share() -> bool:
            limits = _limits(us_nodes, backends[0])
            return len(limits) == 1 and abs(next(iter(limits)) - share) <= 1

        assert wait_for(enforcing_the_share, 30), (_limits(us_nodes, backends[0]), share, limits_before)
        status, body = http_get(f"http://{us_nodes[0].bind_address}:8080/", headers={"Host": "acme.example.com"})
        assert status == 200 and body.startswith("acme-us-east-"), (status, body)  # still served, by us-east
    finally:
        demo.stop_demo_processes()

    assert run.target_address in {n.bind_address for n in us_nodes}, run.target_address
    assert run.sent == 20 * 5 + 40 * 5 + 80 * 5 + 160 * 5 and run.ok >= 0.99 * run.sent, (run.sent, run.ok)
    assert overflow == 0, f"{overflow} request(s) of the test went to eu-west"
    assert local == run.sent, (local, run.sent)
    steps = _steps(run)
    assert run.knee_code == knee.KNEE_FOUND, (run.knee_reason, steps)
    assert run.knee_step_index == 2 and run.knee_capacity_rps == pytest.approx(80, rel=0.1), (run.knee_reason, steps)
    assert run.healthy_members == 2
    assert run.recommended_max_rate_per_member == pytest.approx(run.knee_capacity_rps / 2 * 0.8, rel=0.01)
    assert "/ 2 active member(s)" in run.recommendation_note, run.recommendation_note
