"""Count the wiring done after construction in the controller's composition root.

Wiring after construction is what makes go-to-definition stop short: an attribute set on
an object that already exists (``registry.stages = ...``, ``self.detection.on_pending =
...``) or a listener appended to another object's list. Counted from the source's AST:

- an assignment whose target is an attribute of anything but ``self`` itself
  (``self.x = ...`` builds the object under construction; ``self.x.y = ...`` and
  ``obj.y = ...`` change another one);
- a call ``<...>.listeners.append/extend/insert(...)``: a listener added after the fact.

    python tools/wiring_count.py [--root DIR] [FILE ...]   (default: the service and the core)
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

DEFAULT_FILES = ("controller/service.py", "controller/core.py")
_GROWERS = {"append", "extend", "insert"}


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        out: list[ast.expr] = []
        for t in stmt.targets:
            out.extend(t.elts if isinstance(t, ast.Tuple) else [t])
        return out
    if isinstance(stmt, ast.AugAssign | ast.AnnAssign):
        return [stmt.target]
    return []


def wiring(source: str) -> list[tuple[int, str]]:
    """(line, the statement) for every post-construction assignment or listener append."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.stmt):
            for target in _targets(node):
                if isinstance(target, ast.Attribute) and not _is_self(target.value):
                    found.append((node.lineno, ast.unparse(target)))
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in _GROWERS
            and isinstance(node.func.value, ast.Attribute)
            and "listener" in node.func.value.attr
        ):
            found.append((node.lineno, ast.unparse(node.func)))
    return sorted(set(found))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="the checkout to read (default: here)")
    ap.add_argument("files", nargs="*", default=list(DEFAULT_FILES))
    args = ap.parse_args(argv)
    total = 0
    for name in args.files:
        path = args.root / name
        if not path.exists():
            print(f"{name}: absent")
            continue
        found = wiring(path.read_text())
        total += len(found)
        print(f"{name}: {len(found)}")
        for line, what in found:
            print(f"  {line}: {what}")
    print(f"total: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
