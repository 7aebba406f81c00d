"""Inside fleets, each concern keeps to its place (module level; tests/core/test_import_layers.py does apps).

- Other apps reach fleets through `models`, `services` (writes) and `selectors` (reads) only.
- Nothing inside fleets imports that facade or the Django shell (tasks, views, api, receivers): a change's path
  runs one way, from the shell down, never back up through `services`.
- `config/` (render pipeline) never imports `rollout/` or `health/`: what is rendered does not depend on how
  it is rolled out.
- `node/` (talking to a node) and the renderer (`config/render/`, `config/spec.py`, `config/digest.py`) import
  no Django, directly or through anything they import: they run in threads and in benchmarks without a database.

Read from the source (module-level and function-level imports alike).
"""

from __future__ import annotations

import shutil
import sys
from functools import cache
from pathlib import Path

import pytest

from tests.source import absolute_imports

REPO = Path(__file__).resolve().parents[2]
FLEETS = REPO / "apps" / "fleets"

FACADE = {"apps.fleets", "apps.fleets.models", "apps.fleets.services", "apps.fleets.selectors"}
# Outside fleets, the modules allowed beyond the facade, each with its reason.
OUTSIDE_EXCEPTIONS: dict[tuple[str, str], str] = {
    ("frontend", "apps.fleets.api.serializers"): "the UI's forms validate through the API's serializers (one rule set)",
    ("controlplane", "apps.fleets.config.routelane"): "a worker process turns on freezing of its route lanes at start",
    ("apps", "apps.fleets.config.render.sections"): "apps.signals parses the request log by the very fields the "
    "config writes (a pure module, no Django through it)",
}
SHELL = ("apps.fleets.services", "apps.fleets.selectors", "apps.fleets.tasks", "apps.fleets.views",
         "apps.fleets.api", "apps.fleets.receivers", "apps.fleets.urls")
DJANGO_FREE = ("apps.fleets.node", "apps.fleets.config.render", "apps.fleets.config.spec",
               "apps.fleets.config.digest", "apps.fleets.caches")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def module_path(name: str) -> Path | None:
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


@cache
def imports_of(path: Path) -> frozenset[str]:
    """Modules `path` imports; `from pkg import name` counts pkg.name when that is a module, else pkg."""
    found: set[str] = set()
    for module, names in absolute_imports(path):
        if not names:
            found.add(module)
        for name in names:
            submodule = f"{module}.{name}"
            found.add(submodule if module_path(submodule) is not None else module)
    return frozenset(found)


def under(module: str, prefixes: tuple[str, ...] | set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def fleets_modules() -> list[Path]:
    return [p for p in FLEETS.rglob("*.py") if "migrations" not in p.parts]


def test_other_apps_reach_fleets_only_through_its_facade():
    wrong = []
    for root in ("apps", "frontend", "controlplane"):
        for path in (REPO / root).rglob("*.py"):
            if path.is_relative_to(FLEETS) or "migrations" in path.parts:
                continue
            owner = path.relative_to(REPO).parts[0] if root != "apps" else "apps"
            for module in imports_of(path):
                if not module.startswith("apps.fleets") or module in FACADE:
                    continue
                if (owner, module) not in OUTSIDE_EXCEPTIONS:
                    wrong.append(f"{path.relative_to(REPO)} imports {module}")
    assert wrong == [], "use apps.fleets.services / selectors (add what you need there):\n" + "\n".join(wrong)


def test_nothing_inside_fleets_imports_the_facade_or_the_shell():
    wrong = []
    for path in fleets_modules():
        name = module_name(path)
        if under(name, SHELL) or name in ("apps.fleets.apps", "apps.fleets.beat") or under(
                name, ("apps.fleets.management", "apps.fleets.demo")):
            continue  # the shell itself, app wiring, commands and the demo sit on top
        wrong += [f"{name} imports {m}" for m in imports_of(path) if under(m, SHELL)]
    assert wrong == [], "\n".join(wrong)


def test_config_never_imports_rollout_or_health():
    wrong = []
    for path in (FLEETS / "config").rglob("*.py"):
        wrong += [f"{module_name(path)} imports {m}" for m in imports_of(path)
                  if under(m, ("apps.fleets.rollout", "apps.fleets.health", "apps.fleets.enforcement"))]
    assert wrong == [], "\n".join(wrong)


def django_reached(start: str) -> list[str]:
    """An import chain from `start` to Django (or []), following repository modules."""
    seen: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        name = todo.pop()
        path = module_path(name)
        if path is None:
            continue
        for module in sorted(imports_of(path)):
            if module.split(".")[0] in ("django", "rest_framework", "celery"):
                chain = [module, name]
                while seen[chain[-1]] is not None:
                    chain.append(seen[chain[-1]])
                return list(reversed(chain))
            if module.split(".")[0] in ("apps", "frontend", "controlplane") and module not in seen:
                seen[module] = name
                todo.append(module)
    return []


@pytest.mark.parametrize("path", [p for p in fleets_modules() if under(module_name(p), DJANGO_FREE)],
                         ids=lambda p: module_name(p))
def test_node_and_renderer_import_no_django(path: Path):
    chain = django_reached(module_name(path))
    assert chain == [], " -> ".join(chain)


def test_the_checks_fail_on_a_deliberate_violation(tmp_path, monkeypatch):
    """Each rule above, broken once in a copy of the source, is caught. A copy, not the real tree: other test
    files scan apps/ on other workers at the same time, and a probe written there failed them."""
    copy = tmp_path / "repo"
    for root in ("apps", "frontend", "controlplane"):
        shutil.copytree(REPO / root, copy / root,
                        ignore=shutil.ignore_patterns("__pycache__", "templates", "static", "node_modules"))
    this = sys.modules[__name__]
    monkeypatch.setattr(this, "REPO", copy)
    monkeypatch.setattr(this, "FLEETS", copy / "apps" / "fleets")
    imports_of.cache_clear()
    test_other_apps_reach_fleets_only_through_its_facade()  # the copy passes as the real tree does
    test_nothing_inside_fleets_imports_the_facade_or_the_shell()
    bad = FLEETS / "node" / "_violation_probe.py"
    bad.write_text("from django.conf import settings\nfrom apps.fleets import services\n")
    try:
        imports_of.cache_clear()
        assert django_reached("apps.fleets.node._violation_probe")[-1] == "django.conf"
        with pytest.raises(AssertionError):
            test_nothing_inside_fleets_imports_the_facade_or_the_shell()
    finally:
        bad.unlink()
        imports_of.cache_clear()
    probe = FLEETS / "config" / "_violation_probe.py"
    probe.write_text("from apps.fleets.rollout import lease\n")
    try:
        with pytest.raises(AssertionError):
            test_config_never_imports_rollout_or_health()
    finally:
        probe.unlink()
        imports_of.cache_clear()
    outside = REPO / "apps" / "capacity" / "_violation_probe.py"
    outside.write_text("from apps.fleets.node.apply import apply_node\n")
    try:
        with pytest.raises(AssertionError):
            test_other_apps_reach_fleets_only_through_its_facade()
    finally:
        outside.unlink()
        imports_of.cache_clear()
