"""Reading Spillway's own source for the structure tests (layers, outbound calls)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path


def parse(path: Path) -> ast.Module:
    """`ast.parse`, tried again on CPython 3.11's spurious SystemError.

    3.11 keeps the AST constructor's recursion depth in interpreter-wide state, and a thread that formats a
    traceback at the same moment (3.11's carets parse the failing line) leaves it off by some levels:
    "AST constructor recursion depth mismatch" (python/cpython#106905). Tests that leave server threads behind
    make that possible in any test process, and a CI run was refused for it once.
    """
    source = path.read_text()
    for _attempt in range(3):
        try:
            return ast.parse(source, str(path))
        except SystemError:
            continue
    return ast.parse(source, str(path))


def absolute_imports(path: Path) -> Iterator[tuple[str, list[str]]]:
    """(module, names) for each absolute import in `path`, at any depth: `import a.b` → ("a.b", []),
    `from a import b, c` → ("a", ["b", "c"])."""
    for node in ast.walk(parse(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module, [alias.name for alias in node.names]
