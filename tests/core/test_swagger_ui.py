"""The Swagger UI at /api/v1/docs/ renders the API's operations in real headless Chromium, under the site's CSP.

It was blank: its assets came from a CDN that the machine cannot reach and that the CSP forbids, and its
init script was inline. Now the assets come from drf-spectacular-sidecar on our origin and the init
script from the split view's ?script URL.
"""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest

from tests.browser import shot

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_swagger_ui_renders_the_operations_with_local_assets_under_the_csp(page, live_server) -> None:
    origins: set[str] = set()
    failed: list[str] = []
    page.on("request", lambda r: origins.add(urlsplit(r.url).netloc))
    page.on("requestfailed", lambda r: failed.append(r.url))
    response = page.goto("/api/v1/docs/")
    assert "script-src 'self'" in response.headers["content-security-policy"]

    page.locator(".opblock").first.wait_for()
    shot(page, "api-docs")
    # The operation list is virtualized (only what is in view is in the DOM): scroll through it all.
    seen: set[str] = set()
    for _ in range(150):
        seen.update(page.locator(".opblock-summary-path").all_inner_texts())
        if "/api/v1/traffic/what-if/" in seen:
            break
        page.mouse.wheel(0, 700)
        page.wait_for_timeout(50)
    assert {"/api/v1/load-balancers/{id}/applied/", "/api/v1/traffic/what-if/"} <= seen
    assert len(seen) > 60  # every endpoint, not an empty shell

    assert origins == {urlsplit(live_server.url).netloc}, origins
    assert failed == []
    blocked = [e for e in page.console_errors if "Content Security Policy" in e and "script" in e]
    assert blocked == [], blocked
