"""Real headless Chromium (Debian's /usr/bin/chromium) driven by Playwright against a live server.

Screenshots of the main pages go to test-output/screenshots/ (not committed).
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import deps

# Playwright's sync API keeps an event loop on the test thread; the ORM calls the tests
# make there are still synchronous, so Django's async guard is switched off for them.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

CHROMIUM = os.environ.get("CHROMIUM_BIN", "/usr/bin/chromium")
SHOTS = Path(__file__).resolve().parents[1] / "test-output" / "screenshots"
# Without these flags Chromium tries Google's hosts at start and on a closed network
# spends its time on refused connections.
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


@pytest.fixture(scope="session")
def browser() -> Iterator[object]:
    if not shutil.which(CHROMIUM) and not Path(CHROMIUM).exists():
        deps.missing(f"{CHROMIUM} not installed (apt-get install chromium)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=ARGS, headless=True)
        yield b
        b.close()


@contextlib.contextmanager
def open_page(browser, base_url: str) -> Iterator[object]:
    """A page in a browser context of its own at `base_url`, as every browser test has one: its window size, its
    10 s timeout, and the console errors kept on it (`page.console_errors`)."""
    context = browser.new_context(base_url=base_url, viewport={"width": 1280, "height": 900})
    try:
        pg = context.new_page()
        pg.set_default_timeout(10_000)
        errors: list[str] = []
        pg.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        pg.console_errors = errors  # type: ignore[attr-defined]
        yield pg
    finally:
        context.close()


@pytest.fixture
def page(browser, live_server):
    with open_page(browser, live_server.url) as pg:
        yield pg


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def login(page, username: str, password: str) -> None:
    page.goto("/login/")
    page.get_by_label("Username").fill(username)
    page.get_by_label("Password").fill(password)
    page.get_by_role("button", name="Log in").click()
    page.wait_for_url("**/")


def wait_for_result(page, expected) -> None:
    """Wait for what a form's request should show (`expected`, a locator); when the request failed instead, fail
    with the note the page shows for it (frontend/static/js/spillway.js), not with a bare timeout."""
    failed = page.locator(".request-error")
    expected.or_(failed).first.wait_for()
    if not expected.count() and failed.count():
        raise AssertionError(f"the request failed; the page says: {failed.first.inner_text()}")
