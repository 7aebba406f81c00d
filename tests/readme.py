"""The commands README.md shows in its code blocks (tests/test_readme.py runs them as written)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"^```[^\n]*\n(.*?)^```", re.S | re.M)


def commands() -> list[str]:
    """Every command line of every code block, without its trailing `# comment`."""
    out = []
    for block in _BLOCK.findall(README.read_text()):
        for line in block.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line and not line.startswith("#"):
                out.append(line)
    return out


def command(prefix: str) -> str:
    """The one README command starting with prefix."""
    found = [c for c in commands() if c.startswith(prefix)]
    assert len(found) == 1, f"README.md should show exactly one `{prefix} …` command, shows {found}"
    return found[0]
