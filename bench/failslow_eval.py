"""Fail-slow peer comparison at fleet size: how long one evaluation holds the controller's loop.

``FailSlowDetector.evaluate`` runs on the controller's event loop every ``failslow_every_s``
(5 s) and compares every node with its group on every signal; while it runs, no report is
decided. This bench fills the windows of ``--nodes`` nodes in groups of ``--group`` (a
fabric block) with ``--samples`` reports each (a full 5 min window at 5 s is 60), four
signals per report, then times ``evaluate`` (median of ``--repeats``) and ``append`` per
report. One node in each group is slow, so the comparison finds something.

    .venv/bin/python -m bench.failslow_eval [--quick] [--nodes 10000] [--group 32] [--samples 60]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from typing import Any

from bench.common import quiet_logging, table, write_result
from controller.detect.failslow import FailSlowConfig, FailSlowDetector
from starpulse.core.clock import FakeClock

NAME = "failslow_eval"
_DONE = object()  # what next() gives once an evaluation has finished


def run(nodes: int, group: int, samples: int, repeats: int) -> dict[str, Any]:
    clock = FakeClock(1_000_000)
    rng = random.Random(1)
    detector = FailSlowDetector(FailSlowConfig(), group_of=lambda n: f"block:{int(n[5:]) // group}", clock=clock)
    names = [f"node-{i:05d}" for i in range(nodes)]
    append_s = 0.0
    for _ in range(samples):
        clock.advance(5)
        started = time.perf_counter()
        for i, name in enumerate(names):
            slow = 0.6 if i % group == 0 else 1.0
            detector.append(name, {
                "sm_clock_mhz": 1980 * slow + rng.random(),
                "power_w": 650 * slow + rng.random(),
                "gpu_util_pct": 95 + rng.random(),
                "nic_gbps": 350 * slow + rng.random(),
            })  # fmt: skip
        append_s += time.perf_counter() - started
    timings = []
    opened = 0
    for _ in range(repeats):
        clock.advance(5)
        started = time.perf_counter()
        changes = detector.evaluate()
        timings.append(time.perf_counter() - started)
        opened += sum(1 for c in changes if c.kind == "opened")
    # As the controller runs it: in steps of ~500 nodes, the event loop free in between.
    longest_step = 0.0
    steps = 0
    for _ in range(repeats):
        clock.advance(5)
        changes: list[Any] = []
        running = detector.evaluation_steps(changes)
        while True:
            started = time.perf_counter()
            finished = next(running, _DONE) is _DONE
            longest_step = max(longest_step, time.perf_counter() - started)
            steps += 1
            if finished:
                break
    return {
        "nodes": nodes,
        "stepwise_longest_step_ms": round(1000 * longest_step, 1),
        "stepwise_steps_per_evaluation": round(steps / repeats, 1),
        "group_size": group,
        "samples_per_window": samples,
        "evaluate_ms_median": round(1000 * statistics.median(timings), 1),
        "evaluate_ms_max": round(1000 * max(timings), 1),
        "append_us_per_report": round(1e6 * append_s / (samples * nodes), 2),
        "conditions_opened": opened,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,000 nodes, 20 samples")
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--samples", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    quiet_logging()  # one "failslow_flagged" line per slow node otherwise
    nodes = args.nodes or (1_000 if args.quick else 10_000)
    samples = args.samples or (20 if args.quick else 60)
    figures = run(nodes, args.group, samples, args.repeats)
    print(table("fail-slow evaluation (one event-loop hold every failslow_every_s)", list(figures.items())))
    params = {"nodes": nodes, "group": args.group, "samples": samples, "repeats": args.repeats}
    path = write_result(NAME, params, figures)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
