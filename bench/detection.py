"""Detection latency per fault kind and root-cause correctness per scenario, over the suite.

Runs every scenario in tests/scenarios/ (real controller, one real agent per node and
switch, loopback gRPC) and reports, per fault kind, the median seconds from injection to
the incident that names the right component, and per scenario whether every expected
root cause was found and nothing forbidden was opened.

    python -m bench.detection [--only NAME ...]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import median, quiet_logging, table, write_result
from starpulse.app.scenario.runner import run_scenario
from starpulse.app.scenario.spec import load_scenario

SUITE_DIR = Path(__file__).resolve().parent.parent / "tests" / "scenarios"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--only", nargs="*", default=None, help="scenario names (file stems) to run")
    args = parser.parse_args()
    quiet_logging()
    paths = sorted(SUITE_DIR.glob("*.yaml"))
    if args.only:
        paths = [p for p in paths if p.stem in set(args.only)]
    latencies: dict[str, list[float]] = defaultdict(list)
    per_scenario: dict[str, Any] = {}
    for path in paths:
        started = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="bench-detect-") as tmp:
            verdict = asyncio.run(run_scenario(load_scenario(path), Path(tmp)))
        faults = verdict["faults"]
        for f in faults:
            if f["detection_latency_s"] is not None:
                latencies[f["kind"]].append(float(f["detection_latency_s"]))
        per_scenario[verdict["scenario"]] = {
            "root_cause_correct": verdict["expectations"]["passed"],
            "faults_detected": sum(1 for f in faults if f["incident"]),
            "faults": len(faults),
            "incidents": len(verdict["incidents"]),
            "failures": verdict["expectations"]["failures"],
            "wall_s": round(time.monotonic() - started, 1),
        }
    rows = [(kind, f"{median(v):.1f} s  (n={len(v)})") for kind, v in sorted(latencies.items())]
    print(table("detection latency, fault injected -> incident opened (median)", rows))
    print(
        table(
            "root cause per scenario",
            [
                (
                    name,
                    f"{'correct' if s['root_cause_correct'] else 'WRONG'}; {s['faults_detected']}/{s['faults']} "
                    f"faults detected; {s['incidents']} incidents",
                )
                for name, s in per_scenario.items()
            ],
        )
    )
    write_result(
        "detection",
        {"scenarios": [p.stem for p in paths]},
        {
            "latency_median_s": {k: round(median(v), 3) for k, v in latencies.items()},
            "latency_samples_s": dict(latencies),
            "scenarios": per_scenario,
        },
    )


if __name__ == "__main__":
    main()
