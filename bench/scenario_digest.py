"""A digest of the scenario suite's verdicts without their timings: the same code gives the
same digest, so a refactor that claims "no behaviour change" can be checked against it.

    python -m bench.scenario_digest [--scenarios tests/scenarios] [--json]

Each scenario runs through ``starpulse scenario run --json`` in its own process; every key
that is a time (``*_s``, ``*_ms``) or a wall-clock-dependent figure is dropped, and what
remains (faults, incidents with kind, root cause, severity, action and members, evictions,
jobs, expectations) is hashed. Scenarios run one after another, nothing else should run.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

_TIMING_SUFFIXES = ("_s", "_ms")
# Figures that follow from how far the simulated training got in wall-clock time, not from a decision:
# the step a job resumed from and the steps it lost.
_TIMING_KEYS = {"steps_lost", "resumed_from_step"}


def strip_timings(value: Any) -> Any:
    """The verdict with every time-valued key removed, recursively."""
    if isinstance(value, dict):
        return {
            k: strip_timings(v)
            for k, v in sorted(value.items())
            if not k.endswith(_TIMING_SUFFIXES) and k not in _TIMING_KEYS
        }
    if isinstance(value, list):
        return [strip_timings(v) for v in value]
    return value


def run_one(path: Path, cli_module: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", cli_module, "scenario", "run", "--json", str(path)],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{path}: starpulse scenario run exited {proc.returncode}: {proc.stderr.strip()[-500:]}")
    verdict = json.loads(proc.stdout)
    verdict.pop("schema", None)  # the document's version (docs/json.md), not the result: older trees print none
    return verdict


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenarios", default="tests/scenarios", help="folder of scenario YAML files")
    parser.add_argument("--json", action="store_true", help="print the stripped verdicts too")
    parser.add_argument("--cli-module", default="starpulse.app.cli", help="the CLI to run (an older tree's module)")
    args = parser.parse_args()
    total = hashlib.sha256()
    for path in sorted(Path(args.scenarios).glob("*.yaml")):
        stripped = strip_timings(run_one(path, args.cli_module))
        text = json.dumps(stripped, sort_keys=True)
        total.update(path.name.encode() + b"\0" + text.encode() + b"\0")
        passed = stripped.get("expectations", {}).get("passed")
        print(f"{path.name:<24} {hashlib.sha256(text.encode()).hexdigest()[:16]}  passed={passed}")
        if args.json:
            print(json.dumps(stripped, indent=1, sort_keys=True))
    print(f"suite digest {total.hexdigest()[:16]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
