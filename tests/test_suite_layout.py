"""The suite's own layout: a test module or conftest imports helpers from kits (tests/*kit.py, tests/personas.py,
tests/netutil.py, ...), never from a test module or a conftest. Importing a test module runs its module-level code
(and its fixtures' registration) a second time under another name, and a helper that lives in a test module is found
by nobody who needs it next."""

from __future__ import annotations

from pathlib import Path

from tests.source import absolute_imports

TESTS = Path(__file__).resolve().parent


def _is_test_module(module: str) -> bool:
    last = module.rsplit(".", 1)[-1]
    return module.startswith("tests.") and (last.startswith("test_") or last == "conftest")


def imports_of_test_modules(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        if "node_modules" in path.parts:
            continue
        for module, names in absolute_imports(path):
            targets = [module] + [f"{module}.{name}" for name in names]
            found += [f"{path.relative_to(root.parent)} imports {t}" for t in targets if _is_test_module(t)]
    return found


def test_no_module_of_the_suite_imports_a_test_module_or_a_conftest() -> None:
    assert imports_of_test_modules(TESTS) == []


def test_the_check_names_a_test_module_imported_from_another(tmp_path: Path) -> None:
    (tmp_path / "tests" / "traffic").mkdir(parents=True)
    (tmp_path / "tests" / "traffic" / "test_a.py").write_text("from tests.traffic.test_b import helper\n")
    (tmp_path / "tests" / "traffic" / "test_c.py").write_text("from tests.traffic import conftest\n")
    (tmp_path / "tests" / "traffic" / "test_d.py").write_text("from tests.traffic.livekit import start\n")
    assert imports_of_test_modules(tmp_path / "tests") == [
        "tests/traffic/test_a.py imports tests.traffic.test_b",
        "tests/traffic/test_c.py imports tests.traffic.conftest",
    ]
