"""var/local.env: the settings `make run` generates once (dev secrets, DEBUG=1), read by manage.py.

`make run` calls `python controlplane/localenv.py` (a file, not `-m`: the package imports the
settings), which writes the file when it is missing, so that `.venv/bin/python manage.py mktoken …`
works afterwards exactly as the README shows, without exporting anything. Values already in the
environment win over the file. The suite never reads it (SPILLWAY_TESTING): a developer's local
file must not change what the tests see.
"""

from __future__ import annotations

import os
import secrets
import sys
from pathlib import Path

from dotenv import load_dotenv

BASE_DIR = Path(__file__).resolve().parent.parent


def path(var_dir: Path | None = None) -> Path:
    return (var_dir or Path(os.environ.get("SPILLWAY_VAR_DIR", str(BASE_DIR / "var")))) / "local.env"


def load(var_dir: Path) -> bool:
    """Read var/local.env into os.environ (environment wins); True when it was there."""
    return load_dotenv(path(var_dir), override=False)


def ensure(var_dir: Path | None = None) -> Path:
    """Write var/local.env with fresh dev secrets unless it exists (mode 0600)."""
    target = path(var_dir)
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # A checkout that ran `make run` before this file existed stored its secrets under the dev-only
    # key; a new key would make them unreadable, so such a checkout keeps it.
    old_db = (target.parent / "spillway.sqlite3").exists()
    field_key = "dev-only-field-key" if old_db else secrets.token_urlsafe(32)
    text = ("# Written by `make run` for this checkout only: development settings with generated secrets.\n"
            "# Not for production (set SECRET_KEY, FIELD_ENCRYPTION_KEY and DEBUG=0 in the real environment).\n"
            "DEBUG=1\n"
            f"SECRET_KEY={secrets.token_urlsafe(48)}\n"
            f"FIELD_ENCRYPTION_KEY={field_key}\n")
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    return target


if __name__ == "__main__":
    written = ensure()
    sys.stdout.write(f"local settings: {written}\n")
