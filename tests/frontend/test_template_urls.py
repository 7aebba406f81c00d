"""Every path a template links to, fetches or posts to comes from `{% url %}`: a page moved in urls.py
then moves its links with it, and a renamed view breaks the template's render in the tests instead of
leaving a 404 for a person to find."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARD_CODED = re.compile(r'\b(?:hx-(?:get|post|put|patch|delete)|href|action|src)="/')


def test_templates_write_no_path_by_hand() -> None:
    found = [f"{path.relative_to(REPO)}:{number}: {line.strip()[:100]}"
             for root in (REPO / "frontend", REPO / "apps")
             for path in sorted(root.rglob("templates/**/*.html"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if HARD_CODED.search(line)]
    assert not found, "use {% url %}:\n" + "\n".join(found)
