"""tests/ mirrors the code: a folder per app of apps/ (and frontend/), none for code that is not there."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Folders of tests/ that hold no app's tests: benchmarks, a probe the dependency check runs, the test OpenID provider.
NOT_APPS = {"bench", "probes", "oidc_op"}


def _packages(folder: Path) -> set[str]:
    return {p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith((".", "_"))}


def test_every_app_has_its_test_folder_and_every_test_folder_an_app():
    apps = ROOT / "apps"
    code = {name for name in _packages(apps) if (apps / name / "__init__.py").exists()} | {"frontend"}
    tests = _packages(ROOT / "tests") - NOT_APPS - {"node_modules"}
    assert code - tests == set(), f"apps without a tests/ folder: {sorted(code - tests)}"
    assert tests - code == set(), f"tests/ folders for no app: {sorted(tests - code)}"
    for name in code:
        assert any((ROOT / "tests" / name).glob("test_*.py")), f"tests/{name}/ has no tests"
