"""A failover drill run end to end from the pool page in real Chromium: a real Celery worker runs it, a real
2 x 2 HAProxy fleet serves 30 req/s arriving in ra, the enforcement loop runs beside (as the enforcer
process does), and the report page's figures are compared with what the members themselves served."""

from __future__ import annotations

import re
import threading
import time
from datetime import datetime

import pytest
from django.template.defaultfilters import floatformat

from apps.accounts.models import Role
from apps.accounts.services import user_create_with_membership
from apps.capacity.models import Drill
from tests.browser import login, shot
from tests.traffic.livekit import NODES, EnforcerThread, Load, start

pytestmark = [pytest.mark.browser, pytest.mark.haproxy, pytest.mark.django_db(transaction=True)]


class Hits:
    """The members' own counts, recorded 10 times a second with the wall-clock time (to compare with the
    drill's timestamps afterwards)."""

    def __init__(self, fleet) -> None:
        self.fleet = fleet
        self.rows: list[tuple[float, dict[str, int]]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while not self.stop.wait(0.1):
            self.rows.append((time.time(), self.fleet.hits()))

    def rate(self, region: str, since: datetime, until: datetime) -> float:
        a = min(self.rows, key=lambda row: abs(row[0] - since.timestamp()))
        b = min(self.rows, key=lambda row: abs(row[0] - until.timestamp()))
        return (b[1].get(region, 0) - a[1].get(region, 0)) / (b[0] - a[0])


def test_an_editor_runs_a_drill_from_the_pool_page_and_reads_its_report(
        page, two_regions, haproxy_node, tiny_backend, celery_worker_factory) -> None:
    fleet = start(two_regions, haproxy_node, tiny_backend)
    user_create_with_membership(username="dora", password="dora-pass-123", org=two_regions.pool.org,
                                role=Role.EDITOR)
    celery_worker_factory(name="drill-w1", concurrency=1)
    enforcer = EnforcerThread()
    load = Load(NODES["ra1"][1], fleet.port, 30.0, duration_s=40.0)
    hits = Hits(fleet)
    try:
        login(page, "dora", "dora-pass-123")
        page.goto(f"/traffic/pools/{fleet.pool.pk}/")
        card = page.locator("#drills")
        card.get_by_text("No drill has run on this pool yet.").wait_for()
        card.get_by_label("Region to drain").select_option("ra")
        card.get_by_label("For (seconds)").fill("6")
        asked: list[str] = []
        page.once("dialog", lambda dialog: (asked.append(dialog.message), dialog.accept()))
        card.get_by_role("button", name="Run drill now").click()
        page.wait_for_url(re.compile(r"/capacity/drills/\d+/$"))
        assert asked and asked[0].startswith("Drain this region now?"), asked
        page.locator("#drill-progress .badge", has_text=re.compile("passed|failed|cancelled")).wait_for(
            timeout=40_000)
        drill = Drill.objects.get()
        # Every sample on its own line: pytest cuts a long repr in the middle, where the failing window is.
        assert drill.status == Drill.Status.PASSED, "\n".join(
            [f"{drill.status} {drill.failed_check}: {drill.reason}"]
            + [" ".join(f"{k}={s.get(k)}" for k in ("t", "phase", "arrived", "served", "failed", "unanswered"))
               for s in drill.samples])
        page.locator("[data-drill-chart][data-rendered='1']").wait_for()
        page.locator("[data-drill-errors][data-rendered='1']").wait_for()
        shot(page, "drill-report")
    finally:
        hits.stop.set()
        enforcer.close()
        load.stop()
    drill.refresh_from_db()
    assert drill.requested_by.startswith("user:")
    assert page.locator("dt:text-is('Requested by') + dd").inner_text() == "dora"  # a name, not "user:<id>"
    # The report's "while drained" figure for rb against rb's members over the same span.
    settled = drill.drained_at.timestamp() + drill.summary["react_s"]
    members_rb = hits.rate("rb", datetime.fromtimestamp(settled, tz=drill.drained_at.tzinfo), drill.restored_at)
    row = page.locator("#drill-moved tr", has_text="rb")
    text = row.locator("td").nth(1).inner_text()
    # The page shows the report's figure, rounded as the template rounds (half up on the decimal: 30.15 -> 30.2,
    # where Python's round() gives 30.1 from the binary float).
    assert text == floatformat(drill.summary["during"]["rb"], 1)
    shown = float(text)
    assert shown == pytest.approx(members_rb, rel=0.1), (shown, members_rb)
    assert float(page.locator("#drill-moved tr", has_text="ra").locator("td").nth(1).inner_text()) <= 1.0
    assert page.console_errors == []  # type: ignore[attr-defined]
    # Back on the pool page, the drill is listed with its outcome.
    page.goto(f"/traffic/pools/{fleet.pool.pk}/")
    page.locator("#drills tr", has_text=f"#{drill.pk}").get_by_text("passed").wait_for()
