"""The codebase keeps the shape docs/design.md draws: no class in ``router/`` or
``providers/`` above 400 lines, and the ledger (every quota call's one door) under 300,
so that each stays one thing a reader can hold."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 400
LIMITS = {"Ledger": 300}


def classes() -> list[tuple[str, str, int]]:
    found = []
    for package in ("router", "providers"):
        for path in sorted((ROOT / package).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.ClassDef):
                    lines = (node.end_lineno or node.lineno) - node.lineno + 1
                    found.append((str(path.relative_to(ROOT)), node.name, lines))
    return found


def test_no_class_outgrows_its_limit() -> None:
    over = [
        f"{path}: class {name} is {lines} lines (limit {LIMITS.get(name, LIMIT)})"
        for path, name, lines in classes()
        if lines >= LIMITS.get(name, LIMIT)
    ]
    assert not over, "split them:\n" + "\n".join(over)
