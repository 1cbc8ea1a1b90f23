"""Count what still reads real time where the fake clock should: tests' asserts and optional clocks.

Two counts, from the source's AST (issue 26 item 7):

- **wall-clock asserts** in ``tests/``: an ``assert`` whose expression calls ``time.time``,
  ``time.monotonic``, ``time.perf_counter`` (or their ``_ns`` forms), or names a local
  variable of the same function assigned from such a call (``t0 = time.monotonic()`` ...
  ``assert time.monotonic() - t0 < 5``). Those comparing with a name containing
  ``deadline``, or one counted back from it, are polling guards (a wait loop's bound
  against a hang, failing only when the awaited thing never comes) and counted apart.
- **optional clocks** in ``controller/``: a parameter annotated ``Clock`` (or ``Clock |
  None``) that has a default, and ``SYSTEM_CLOCK`` used anywhere but such a default: a
  part that falls back to, or picks, the system clock instead of being handed one.

    python tools/clock_count.py [--root DIR] [--list]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

_CLOCK_CALLS = {"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "perf_counter_ns"}


def _reads_clock(node: ast.AST) -> bool:
    """A call of ``time.<one of _CLOCK_CALLS>()`` anywhere in ``node``."""
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr in _CLOCK_CALLS
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "time"
        for n in ast.walk(node)
    )


def _functions(tree: ast.AST) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    for n in ast.walk(tree):
        if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef):
            yield n


def wall_clock_asserts(source: str) -> list[tuple[int, str, bool]]:
    """(line, the assert, whether it is a deadline guard) for every assert reading real time."""
    found: set[tuple[int, str, bool]] = set()
    for fn in _functions(ast.parse(source)):
        timed: set[str] = set()
        bounds: set[str] = set()  # timed names counted back from a deadline (``remaining = deadline - now``)
        for n in ast.walk(fn):
            if isinstance(n, ast.Assign) and _reads_clock(n.value):
                names = {t.id for t in n.targets if isinstance(t, ast.Name)}
                timed |= names
                if any(isinstance(x, ast.Name) and "deadline" in x.id for x in ast.walk(n.value)):
                    bounds |= names
        for n in ast.walk(fn):
            if not isinstance(n, ast.Assert):
                continue
            names = {x.id for x in ast.walk(n.test) if isinstance(x, ast.Name)}
            if _reads_clock(n.test) or names & timed:
                guard = any("deadline" in name for name in names) or bool(names & bounds)
                found.add((n.lineno, ast.unparse(n.test), guard))
    return sorted(found)


def _is_clock(annotation: ast.expr | None) -> bool:
    return annotation is not None and any(isinstance(x, ast.Name) and x.id == "Clock" for x in ast.walk(annotation))


def optional_clocks(source: str) -> list[tuple[int, str]]:
    """(line, what) for every defaulted Clock parameter and every other use of SYSTEM_CLOCK."""
    found: list[tuple[int, str]] = []
    defaults: set[int] = set()
    for fn in _functions(ast.parse(source)):
        a = fn.args
        positional = [*a.posonlyargs, *a.args]
        pairs = list(zip(positional[len(positional) - len(a.defaults) :], a.defaults, strict=True))
        pairs += [(arg, d) for arg, d in zip(a.kwonlyargs, a.kw_defaults, strict=True) if d is not None]
        for arg, default in pairs:
            if _is_clock(arg.annotation):
                found.append((arg.lineno, f"{fn.name}({arg.arg}={ast.unparse(default)})"))
                defaults.add(id(default))
    for n in ast.walk(ast.parse(source)):
        if isinstance(n, ast.Name) and n.id == "SYSTEM_CLOCK" and isinstance(n.ctx, ast.Load):
            found.append((n.lineno, "SYSTEM_CLOCK"))
    # a default that is SYSTEM_CLOCK is counted once, as the default
    lines_with_default = {line for line, what in found if "=SYSTEM_CLOCK)" in what}
    return sorted({(line, what) for line, what in found if not (what == "SYSTEM_CLOCK" and line in lines_with_default)})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--root", type=Path, default=Path("."), help="the checkout to read (default: here)")
    ap.add_argument("--list", action="store_true", help="name each one")
    args = ap.parse_args(argv)
    timing = guards = 0
    for path in sorted((args.root / "tests").rglob("*.py")):
        for line, text, guard in wall_clock_asserts(path.read_text()):
            guards += guard
            timing += not guard
            if args.list:
                kind = "deadline guard" if guard else "timing"
                print(f"  {path.relative_to(args.root)}:{line}: [{kind}] assert {text}")
    print(f"wall-clock asserts in tests/: {timing} timing, {guards} deadline guards")
    total = 0
    for path in sorted((args.root / "controller").rglob("*.py")):
        for line, what in optional_clocks(path.read_text()):
            total += 1
            if args.list:
                print(f"  {path.relative_to(args.root)}:{line}: {what}")
    print(f"optional clocks in controller/: {total}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
