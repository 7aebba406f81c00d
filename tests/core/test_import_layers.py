"""Imports point down the declared layer order, and no two apps import each other.

Derived from the source (module-level and function-level imports alike, since a function-level import
is still a dependency, only a hidden one). Layers, lowest first — docs/ARCHITECTURE.md says why:

    core → audit, events → accounts → balancers → traffic → fleets → capacity, scheduling, cloud
    → frontend → controlplane

An app may import its own layer or lower ones; same-layer imports must not form a cycle. Every upward
edge that would still exist is listed in KNOWN_UPWARD with its reason (none is): removing one is progress
(the test says to drop it from the list), adding one fails.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from tests.source import absolute_imports

REPO = Path(__file__).resolve().parents[2]
LAYERS: dict[str, int] = {
    "core": 0, "audit": 1, "accounts": 2, "balancers": 3, "traffic": 4, "fleets": 5,
    "events": 1, "capacity": 6, "scheduling": 6, "cloud": 6, "certificates": 6, "acme": 6, "configcode": 6,
    "signals": 6,
    "frontend": 8, "controlplane": 9,
}
# (from, to): why it is still there. Each is debt with a named way out; there is none left. When a lower
# app needs something of a higher one, the higher one hands it in (signals, or a reader it provides from
# its AppConfig.ready, as fleets does for traffic in apps/traffic/readers.py).
KNOWN_UPWARD: dict[tuple[str, str], str] = {}


def _owner(path: Path) -> str | None:
    rel = path.relative_to(REPO).parts
    if rel[0] == "apps" and len(rel) > 2:
        return rel[1]
    if rel[0] in ("frontend", "controlplane"):
        return rel[0]
    return None


def _target(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] == "apps" and len(parts) > 1:
        return parts[1]
    if parts[0] in ("frontend", "controlplane"):
        return parts[0]
    return None


def import_edges() -> dict[tuple[str, str], set[str]]:
    edges: dict[tuple[str, str], set[str]] = defaultdict(set)
    for root in ("apps", "frontend", "controlplane"):
        for path in (REPO / root).rglob("*.py"):
            if "migrations" in path.parts:
                continue
            src = _owner(path)
            if src is None:
                continue
            for module, _names in absolute_imports(path):
                dst = _target(module)
                if dst is not None and dst != src:
                    edges[(src, dst)].add(str(path.relative_to(REPO)))
    return edges


def test_every_app_has_a_declared_layer():
    apps = {p.name for p in (REPO / "apps").iterdir() if (p / "__init__.py").exists()}
    assert apps - set(LAYERS) == set(), "declare the new app's layer in LAYERS and docs/ARCHITECTURE.md"


def test_imports_point_down_the_layers():
    upward = {edge: files for edge, files in import_edges().items() if LAYERS[edge[1]] > LAYERS[edge[0]]}
    new = {edge: sorted(files) for edge, files in upward.items() if edge not in KNOWN_UPWARD}
    gone = set(KNOWN_UPWARD) - set(upward)
    assert not new, f"imports pointing up the layers: {new}"
    assert not gone, f"fixed, well done: drop {gone} from KNOWN_UPWARD"


def test_no_two_apps_import_each_other():
    edges = import_edges()
    cycles = sorted({tuple(sorted(e)) for e in edges if (e[1], e[0]) in edges and e not in KNOWN_UPWARD
                     and (e[1], e[0]) not in KNOWN_UPWARD})
    assert not cycles, f"apps importing each other: {cycles}"
