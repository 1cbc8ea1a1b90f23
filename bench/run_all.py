"""Run every benchmark in sequence and print one combined table of the headline figures.

    .venv/bin/python -m bench.run_all [--quick]

Each benchmark runs in its own interpreter (a fresh process: no warm caches or leftover
threads from the one before) and writes bench/results/<name>.json; this reads them back.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from typing import Any

from bench.common import RESULTS_DIR, fmt, machine, write_result

BENCHMARKS = ("agent_cycle", "ingest", "fabric")


def headline(name: str, doc: dict[str, Any]) -> list[tuple[str, Any]]:
    f = doc["figures"]
    if name == "agent_cycle":
        c, p = f["cycles"], f["agent_process"]
        return [
            (
                "agent: collect wall ms/cycle median / p99",
                f"{fmt(c['collect_wall_ms_median'])} / {fmt(c['collect_wall_ms_p99'])}",
            ),
            ("agent: collect CPU ms/cycle median", c["collect_cpu_ms_median"]),
            ("agent: report bytes", c["report_bytes"]),
            ("agent: core share at 1 s interval % (in-process)", c["core_share_pct_at_1s_interval"]),
            ("agent process: CPU % of one core at 1 s (psutil)", p["cpu_pct_of_one_core"]),
            ("agent process: RSS MiB median", p["rss_mib_median"]),
        ]
    if name == "ingest":
        rows: list[tuple[str, Any]] = []
        for r in f["runs"]:
            if r["mode"] == "flood":
                rows += [
                    (f"ingest flood {r['streams']} streams: reports/s", r["reports_per_s"]),
                    (f"ingest flood {r['streams']} streams: samples/s", r["samples_per_s"]),
                    (f"ingest flood {r['streams']} streams: controller CPU % / RSS MiB",
                     f"{fmt(r['controller_cpu_pct'])} / {fmt(r['controller_rss_mib_max'])}"),
                ]  # fmt: skip
            else:
                rows += [
                    (f"ingest paced {r['streams']} nodes @{r['interval_s']:g}s: RTT ms p50 / p99",
                     f"{fmt(r['rtt_ms_p50'])} / {fmt(r['rtt_ms_p99'])}"),
                    (f"ingest paced {r['streams']} nodes: controller CPU % / RSS MiB",
                     f"{fmt(r['controller_cpu_pct'])} / {fmt(r['controller_rss_mib_max'])}"),
                ]  # fmt: skip
        return rows
    if name == "fabric":
        rows = []
        for r in f["sizes"]:
            rows.append(
                (f"fabric {r['nodes']} nodes: build s / group ms / correlate ms",
                 f"{fmt(r['build_s_median'])} / {fmt(r['group_ms_median'])} / {fmt(r['correlator_ms_median'])}")
            )  # fmt: skip
        return rows
    return []


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.run_all", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="pass --quick to every benchmark")
    ap.add_argument("--only", nargs="*", choices=BENCHMARKS, default=None)
    args = ap.parse_args(argv)
    names = args.only or list(BENCHMARKS)
    walls: dict[str, float] = {}
    failed: list[str] = []
    for name in names:
        cmd = [sys.executable, "-m", f"bench.{name}", *(["--quick"] if args.quick else [])]
        print(f"\n=== {' '.join(cmd[1:])}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.call(cmd)
        walls[name] = round(time.monotonic() - t0, 1)
        if rc != 0:
            failed.append(name)
    m = machine()
    rows: list[tuple[str, Any]] = []
    for name in names:
        if name in failed:
            rows.append((f"{name}: FAILED", ""))
            continue
        doc = json.loads((RESULTS_DIR / f"{name}.json").read_text())
        rows += headline(name, doc)
    width = max(len(r[0]) for r in rows)
    quick = " (--quick)" if args.quick else ""
    title = f"starpulse benchmarks{quick}: {m['cpu_model']}, {m['cores']} cores, Python {m['python']}"
    title += f", commit {m['git_commit']}"
    print(f"\n{title}\n{'=' * len(title)}")
    for k, v in rows:
        print(f"  {k:<{width}}  {fmt(v)}")
    print("  wall s per benchmark: " + ", ".join(f"{k} {v}" for k, v in walls.items()))
    write_result("run_all", {"quick": args.quick, "benchmarks": names}, {"headline": dict(rows), "wall_s": walls})
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
