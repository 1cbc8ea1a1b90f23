"""Score the ``npu-smi`` parsers against every recorded layout: chips read right / chips present.

The layouts are public outputs with their sources named: ``tests/fixtures/ascend/npu-smi/``
(``info.*.txt`` with ``info.*.expect.json``) and the recorded outputs in
``../shared/fixtures/vendors/ascend/`` read in place (``npu-smi-info.*`` and ``npu-smi-health.*``).
A chip is read right when the parser gives it with the NPU id, chip id, model, bus id (as printed,
``NA`` included) and health grade the expectation says; a health output is right when the grade and
every error code are.

    python -m tools.npu_smi_layouts           # one row per layout
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from agent.collectors.accel.ascend_parse import NpuChip, parse_npu_health, parse_npu_smi_info

ROOT = Path(__file__).resolve().parent.parent
DIRS = (ROOT / "tests" / "fixtures" / "ascend" / "npu-smi", ROOT.parent / "shared" / "fixtures" / "vendors" / "ascend")


def layouts(dirs: tuple[Path, ...] = DIRS) -> list[tuple[Path, dict[str, Any]]]:
    """(output path, expectation) of every ``npu-smi info`` and ``-t health`` output found."""
    out = []
    for d in dirs:
        if not d.is_dir():
            continue
        for exp in sorted(d.glob("*.expect.json")):
            doc = json.loads(exp.read_text(encoding="utf-8"))
            tool = str(doc.get("tool", ""))
            if tool == "npu-smi info" or tool.endswith("-t health"):
                out.append((d / doc["file"], doc))
    return out


def _same(chip: NpuChip, want: dict[str, Any]) -> bool:
    return (
        chip.npu_id == want["npu_id"]
        and chip.chip_id == want["chip_id"]
        and chip.model == want["model"]
        and chip.bus_id.upper() == str(want["bus_id"]).upper()
        and chip.health == want["health"]
    )


def score(path: Path, doc: dict[str, Any]) -> tuple[int, int]:
    """(right, present) for one output: chips for a table, 1 for a health output."""
    text = path.read_text(encoding="utf-8")
    if str(doc["tool"]).endswith("-t health"):
        health = parse_npu_health(text)
        ok = health.health == doc["health"] and health.error_codes == doc.get("error_codes", [])
        return int(ok), 1
    chips = parse_npu_smi_info(text)
    want = doc["devices"]
    right = sum(1 for w in want if any(_same(c, w) for c in chips))
    extra = len(chips) - right  # a chip the output does not hold is a wrong read too
    return max(right - max(extra, 0), 0), len(want)


def main(argv: list[str] | None = None) -> int:
    """Print one row per layout and the total."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.parse_args(argv)
    found = layouts()
    if not found:
        print("no npu-smi layouts found under " + ", ".join(str(d) for d in DIRS), file=sys.stderr)
        return 2
    total = [0, 0]
    for path, doc in found:
        right, present = score(path, doc)
        total[0] += right
        total[1] += present
        print(f"{path.name:<48} {right:>3} / {present:<3} {doc.get('layout', doc['tool'])[:60]}")
    print(f"{'all':<48} {total[0]:>3} / {total[1]:<3}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
