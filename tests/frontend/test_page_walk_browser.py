"""Every page an operator and a tenant reach by following links, walked in a real browser on the full demo set.

What a new operator would notice on day one fails here: a page that errors or is missing, an asset that does not
load (a favicon 404 on every page), a console error, and text a person should never read (a raw ISO timestamp, a
Python dict, an internal actor id like `user:3`, Python's `None`). Each page's screenshot is kept under
test-output/walk/<persona>/ to look at.
"""

from __future__ import annotations

import io
import re
import time
from collections import deque
from urllib.parse import urlsplit

import pytest
from django.core.management import call_command

from apps.balancers.demo import DEMO_PASSWORDS
from tests.browser import SHOTS, login

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

WALK_SHOTS = SHOTS.parent / "walk"
NEVER_SHOWN = (
    (re.compile(r"\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d"), "a raw ISO timestamp"),
    (re.compile(r"\{'[A-Za-z_]+': "), "a Python dict"),
    (re.compile(r"\b(?:user|token):\d+\b"), "an internal actor id"),
    (re.compile(r"(?<![\w-])None(?![\w-])"), "Python's None"),
    (re.compile(r"(?<![\w-])(?:True|False)(?![\w-])"), "Python's True/False"),
    (re.compile(r"(\d\d:\d\d:\d\d UTC) \1"), "the same time twice"),
    (re.compile(r"Traceback \(most recent call last\)|Server Error \(500\)"), "a server error"),
)
# Links not to follow: leaving the session, machine endpoints, downloads.
SKIP = re.compile(r"^/(?:logout|api/|admin/|static/|metrics|healthz|sso/|oidc/)|/export|\.(?:json|yaml|csv|png)$")
PER_PATTERN = 2  # /jobs/1/ and /jobs/2/ show the same template; two of each pattern are enough
LIMIT = 150
QUIET_S = 0.15  # htmx's load-triggered requests start within milliseconds of the load event; polls are ≥ 1 s apart
SETTLE_LIMIT_S = 10.0


class Network:
    """Requests in flight on a page, so a walk waits only as long as the page is still fetching.

    Playwright's "networkidle" waits a fixed 500 ms after the last request on every page: most of a walk's time.
    """

    def __init__(self, page) -> None:
        self.page, self.inflight, self.last = page, 0, time.monotonic()
        self.started_on: dict[object, str] = {}  # request -> the path of the document it started from
        page.on("request", self._started)
        page.on("requestfinished", self._ended)
        page.on("requestfailed", self._ended)

    def _started(self, request) -> None:
        self.inflight, self.last = self.inflight + 1, time.monotonic()
        # The frame's document when the request starts: a poll of the page being left that fires while the next one
        # loads still starts from it (measured: requests up to a second into a navigation name the old document).
        self.started_on[request] = urlsplit(request.frame.url).path

    def left_behind(self, request, path: str) -> bool:
        """A request the walk's navigation cut off: started from another document than `path` (an htmx poll of the
        page left) and aborted, not one that failed on the page now shown."""
        return self.started_on.get(request, path) != path and "ERR_ABORTED" in (request.failure or "")

    def _ended(self, _request) -> None:
        self.inflight, self.last = max(0, self.inflight - 1), time.monotonic()

    def settle(self) -> None:
        """Return once nothing is in flight and nothing has started for QUIET_S (after the load event)."""
        deadline = time.monotonic() + SETTLE_LIMIT_S
        while time.monotonic() < deadline:
            if self.inflight == 0 and time.monotonic() - self.last >= QUIET_S:
                return
            self.page.wait_for_timeout(20)  # lets Playwright deliver the request events
        raise AssertionError(f"{self.page.url}: still fetching after {SETTLE_LIMIT_S:.0f} s")


def walk(page, persona: str) -> tuple[list[str], list[str]]:
    """(pages visited, problems) from the dashboard, following same-site links breadth first."""
    problems: list[str] = []
    current = {"path": "/"}
    network = Network(page)
    page.on("console", lambda msg: problems.append(f"{current['path']}: console {msg.type}: {msg.text}")
            if msg.type == "error" else None)
    page.on("response", lambda r: problems.append(f"{current['path']}: {r.status} for {urlsplit(r.url).path}")
            if r.status >= 400 and urlsplit(r.url).path != current["path"] else None)
    page.on("requestfailed", lambda r: None if network.left_behind(r, current["path"])
            else problems.append(f"{current['path']}: request failed {r.url} ({r.failure})"))
    seen_patterns: dict[str, int] = {}
    queue, queued, visited = deque(["/"]), {"/"}, []
    WALK_SHOTS.joinpath(persona).mkdir(parents=True, exist_ok=True)
    while queue and len(visited) < LIMIT:
        path = queue.popleft()
        current["path"] = path
        response = page.goto(path)
        network.settle()
        visited.append(path)
        if response is None or response.status >= 400:
            problems.append(f"{path}: answered {response.status if response else 'nothing'}")
            continue
        text = page.locator("body").inner_text()
        for pattern, what in NEVER_SHOWN:
            match = pattern.search(text)
            if match:
                start = max(0, match.start() - 40)
                problems.append(f"{path}: shows {what}: …{text[start:match.end() + 40]!r}…")
        name = re.sub(r"[^a-z0-9]+", "-", path.strip("/").lower()) or "dashboard"
        page.screenshot(path=str(WALK_SHOTS / persona / f"{name}.png"), full_page=True)
        for href in page.eval_on_selector_all("a[href]", "els => els.map(e => e.getAttribute('href'))"):
            target = urlsplit(href)
            if target.scheme or target.netloc or not target.path.startswith("/") or SKIP.search(target.path):
                continue
            pattern = re.sub(r"/\d+(?=/|$)", "/N", target.path)
            if target.path in queued or seen_patterns.get(pattern, 0) >= PER_PATTERN:
                continue
            seen_patterns[pattern] = seen_patterns.get(pattern, 0) + 1
            queued.add(target.path)
            queue.append(target.path)
    return visited, problems


@pytest.mark.parametrize("persona", ["admin", "acme"])
def test_every_page_reached_by_links_reads_clean(page, persona):
    call_command("loaddemo", stdout=io.StringIO())
    login(page, persona, DEMO_PASSWORDS[persona])
    visited, problems = walk(page, persona)
    assert len(visited) >= (25 if persona == "admin" else 10), visited
    assert problems == [], "\n".join(dict.fromkeys(problems))
