"""The demo unattended for 10 minutes (issue 19): does the repair loop keep the cluster whole?

Runs ``starpulse demo`` (16 nodes + 1 spare, real agents on simulated hardware, the
in-memory scheduler, the job's ranks real ``examples/train.py`` processes) for
``--duration`` seconds and reads its own output: per fault kind, fault -> node evicted,
fault -> the job training again (its first step after the resume) and fault -> node back
in the pool; leaf switch faults; nodes repaired and retired, the pool at the end, nodes
still in repair (a wedge if any), and the job's ETTR (defined in the demo's summary).
Measured, not asserted; figures go to bench/README.md. Not for CI (10 minutes): the short
run is tests/e2e/test_demo_repair.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import re
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import quiet_logging, table, write_result
from starpulse.app.demo import _demo

NAME = "demo_repair"
_LINE = re.compile(r"^\[\s*(?P<t>[\d.]+)s\] (?P<rest>.*)$")


class Tee(io.TextIOBase):
    """Print as the demo prints, and keep it for parsing."""

    def __init__(self) -> None:
        self.buf = io.StringIO()

    def write(self, s: str) -> int:
        sys.__stdout__.write(s)
        return self.buf.write(s)


def figures(text: str) -> dict[str, Any]:
    """Per fault kind (the injected one): fault -> node evicted, fault -> the job training again
    (its first step after the resume), fault -> node back in the pool; outcomes; ETTR."""
    injected: dict[str, tuple[float, str]] = {}  # node -> (t, kind) of its latest fault
    to_evict: dict[str, list[float]] = {}
    to_resume: dict[str, list[float]] = {}
    to_pool: dict[str, list[float]] = {}
    pending_pool: dict[str, tuple[float, str]] = {}
    pending_resume: dict[str, tuple[float, str]] = {}
    outcomes: dict[str, int] = {}
    switch_faults = 0
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        t, rest = float(m.group("t")), m.group("rest")
        if rest.startswith("inject switch_down"):
            switch_faults += 1
        elif (f := re.match(r"inject (\w+) .*on (node-\d+)/", rest)) is not None:
            injected[f.group(2)] = (t, f.group(1))
        elif (e := re.match(r"healer: evicted (node-\d+)", rest)) is not None and e.group(1) in injected:
            t0, kind = injected.pop(e.group(1))
            to_evict.setdefault(kind, []).append(t - t0)
            pending_pool[e.group(1)] = (t0, kind)
            if "no job ran on it" not in rest:
                pending_resume[e.group(1)] = (t0, kind)
        elif (j := re.match(r"job \S+ resumed \(\w+ on (node-\d+)\)", rest)) is not None:
            if j.group(1) in pending_resume:
                t0, kind = pending_resume.pop(j.group(1))
                to_resume.setdefault(kind, []).append(t - t0)
        elif (r := re.match(r"repair: (node-\d+) -> (\w+)", rest)) is not None:
            outcomes[r.group(2)] = outcomes.get(r.group(2), 0) + 1
            if r.group(2) in ("spare", "in_service") and r.group(1) in pending_pool:
                t0, kind = pending_pool.pop(r.group(1))
                to_pool.setdefault(kind, []).append(t - t0)
            elif r.group(2) == "retired":
                pending_pool.pop(r.group(1), None)
    summary = text[text.index("demo over") :] if "demo over" in text else ""
    ettr = re.search(r"ETTR ([\d.]+)%", summary)
    return {
        "fault_to_evicted_s": {k: statistics.median(v) for k, v in to_evict.items()},
        "fault_to_job_resumed_s": {k: statistics.median(v) for k, v in to_resume.items()},
        "fault_to_back_in_pool_s": {k: statistics.median(v) for k, v in to_pool.items()},
        "switch_faults": switch_faults,
        "outcomes": outcomes,
        "still_in_repair": len(pending_pool),
        "ettr_percent": float(ettr.group(1)) if ettr else None,
        "summary": summary.strip().splitlines(),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.demo_repair", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=16)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds (default 600)")
    args = ap.parse_args(argv)
    quiet_logging()
    tee = Tee()
    with tempfile.TemporaryDirectory(prefix="bench-demo-") as tmp, contextlib.redirect_stdout(tee):
        asyncio.run(_demo(args.nodes, args.duration, "127.0.0.1:0", "127.0.0.1:0", Path(tmp)))
    result = figures(tee.buf.getvalue())
    rows: list[tuple[str, Any]] = [
        *((f"fault -> evicted, {k} (median s)", v) for k, v in sorted(result["fault_to_evicted_s"].items())),
        *((f"fault -> job resumed, {k} (median s)", v) for k, v in sorted(result["fault_to_job_resumed_s"].items())),
        *((f"fault -> back in pool, {k} (median s)", v) for k, v in sorted(result["fault_to_back_in_pool_s"].items())),
        ("leaf switch faults (never an eviction)", result["switch_faults"]),
        ("repair outcomes", ", ".join(f"{k} {v}" for k, v in sorted(result["outcomes"].items())) or "-"),
        ("evicted nodes not back at the end (retired ones aside)", result["still_in_repair"]),
        ("ETTR of the run (%)", result["ettr_percent"] if result["ettr_percent"] is not None else "-"),
    ]
    print(table(f"demo {args.nodes} nodes, {args.duration:.0f} s", rows))
    for line in result["summary"]:
        print(line)
    path = write_result(NAME, {"nodes": args.nodes, "duration_s": args.duration}, result)
    print(f"\nwrote {path}")
    return result


if __name__ == "__main__":
    main()
