"""Reading Spillway's own source for the structure tests (layers, outbound calls)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path


def _parse(source: str, filename: str) -> ast.Module:
    """`ast.parse`, tried again on CPython 3.11's spurious SystemError.

    3.11 keeps the AST constructor's recursion depth in interpreter-wide state, and a thread that formats a
    traceback at the same moment (3.11's carets parse the failing line) leaves it off by some levels:
    "AST constructor recursion depth mismatch" (python/cpython#106905). Tests that leave server threads behind
    make that possible in any test process, and a CI run was refused for it once.
    """
    for _attempt in range(3):
        try:
            return ast.parse(source, filename)
        except SystemError:
            continue
    return ast.parse(source, filename)


def absolute_imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, names) for each absolute import in `path`, at any depth: `import a.b` → ("a.b", []),
    `from a import b, c` → ("a", ["b", "c"])."""
    for module, names in _imports_in(path.read_text(), str(path)):
        yield module, list(names)


# Keyed by the text, so an edited file (the layer tests' deliberate violations) is parsed again. Several structure
# tests walk the whole tree, some twice, and parsing was most of their ~10 s.
@lru_cache(maxsize=8192)
def _imports_in(source: str, filename: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    found: list[tuple[str, tuple[str, ...]]] = []
    for node in ast.walk(_parse(source, filename)):
        if isinstance(node, ast.Import):
            found.extend((alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, tuple(alias.name for alias in node.names)))
    return tuple(found)
