"""The codebase keeps the shape docs/design.md draws: no class in ``router/`` or
``providers/`` above 400 lines, and the ledger (every quota call's one door) under 300,
so that each stays one thing a reader can hold."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 400
LIMITS = {"Ledger": 300}

# Parsed in a process of its own: CPython 3.11's AST conversion is not thread-safe
# (python/cpython#106905), and another thread of this one may be converting.
SCAN = """
import ast, json, pathlib, sys
root = pathlib.Path(sys.argv[1])
found = []
for package in ("router", "providers"):
    for path in sorted((root / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                lines = (node.end_lineno or node.lineno) - node.lineno + 1
                found.append([str(path.relative_to(root)), node.name, lines])
print(json.dumps(found))
"""


def classes() -> list[tuple[str, str, int]]:
    scanned = subprocess.run(
        [sys.executable, "-c", SCAN, str(ROOT)], capture_output=True, text=True, check=True
    )
    return [(path, name, lines) for path, name, lines in json.loads(scanned.stdout)]


def test_no_class_outgrows_its_limit() -> None:
    found = classes()
    assert any(name == "Ledger" for _, name, _ in found)  # the scan saw the code
    over = [
        f"{path}: class {name} is {lines} lines (limit {LIMITS.get(name, LIMIT)})"
        for path, name, lines in found
        if lines >= LIMITS.get(name, LIMIT)
    ]
    assert not over, "split them:\n" + "\n".join(over)
