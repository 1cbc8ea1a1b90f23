"""The controller's periodic ``failslow_step`` at fleet size: what each step holds the event loop.

``bench.scale`` reports the ``failslow_step`` periodic task's mean and longest run, but a scale
sitting takes minutes and mixes everything else on the loop. This builds the controller's real
``Detection`` (its peer groups from the job registry and the fabric, as ``controller.core``
wires them) on a FakeClock, feeds ``--nodes`` nodes' fail-slow samples as the shards hand them
on (one report per node every 5 s, sampled every ``sample_every_s``), and runs the evaluation
every 5 s in the steps the controller runs (``evaluation_steps``), timing each step.

Shapes (``--shape``): ``none``: no fabric, no job (bench.scale's controller: nobody has peers);
``blocks``: a declared fabric, blocks of 32; ``job``: every node's ranks report one job;
``declared``: one job declared over every node (the scheduler's word) whose reports name none.
About 1 % of nodes are slow, so the comparisons find something. The garbage collector is
tuned as the controller tunes it (controller.gcpolicy).

    .venv/bin/python -m bench.failslow_step [--nodes 10000] [--shape none blocks job declared]
"""

from __future__ import annotations

import argparse
import inspect
import random
import sqlite3
import statistics
import time
from typing import Any

from bench.common import quiet_logging, table, write_result
from controller import gcpolicy
from controller.detect.pipeline import Detection
from controller.detect.rules import load_rules
from controller.jobs.registry import JobRegistry
from controller.metrics import ControllerMetrics
from starpulse.core.clock import FakeClock

NAME = "failslow_step"
SHAPES = ("none", "blocks", "job", "declared")
_DONE = object()  # what next() gives once an evaluation has finished
_TICK_S = 5  # the report interval and the evaluation cadence (failslow_every_s)


def _detection(shape: str, nodes: list[str], clock: FakeClock) -> Detection:
    conn = sqlite3.connect(":memory:", isolation_level=None)
    jobs = JobRegistry(conn, clock)
    fabric = None
    if shape == "blocks":
        from bench.probeload import fabric_for

        fabric = fabric_for(len(nodes), 32)
    if shape == "declared":
        jobs.register_job("llm", nodes)
    kwargs: dict[str, Any] = {"jobs_of": jobs.jobs_of, "clock": clock, "failslow_stepwise": True}
    if "first_jobs" in inspect.signature(Detection.__init__).parameters:  # absent before session 13
        kwargs["first_jobs"] = jobs.first_job_by_node
    return Detection(conn, load_rules(), fabric, ControllerMetrics(), **kwargs)


def _names(shape: str, count: int) -> list[str]:
    if shape == "blocks":
        from bench.probeload import fabric_for

        return sorted(fabric_for(count, 32).nodes())
    return [f"node-{i:05d}" for i in range(count)]


def run(shape: str, nodes: int, evaluations: int, seed: int = 1) -> dict[str, Any]:
    clock = FakeClock(1_000_000)
    names = _names(shape, nodes)
    det = _detection(shape, names, clock)
    failslow = det.failslow
    rng = random.Random(seed)
    slow = {n for n in names if rng.random() < 0.01}
    job = "llm" if shape == "job" else None
    every = max(1, round(failslow.config.sample_every_s / _TICK_S))  # reports per sample
    window_ticks = int(failslow.config.window_s / _TICK_S)
    steps: list[float] = []  # wall seconds per step (what the controller's periodic_seconds observes)
    cpu_steps: list[float] = []  # the thread's CPU seconds per step: steadier on a shared machine
    evaluation_s: list[float] = []
    evaluation_cpu_s: list[float] = []
    append_s = 0.0
    appends = 0
    for tick in range(window_ticks + evaluations):
        clock.advance(_TICK_S)
        started = time.perf_counter()
        for i, name in enumerate(names):
            if (i + tick) % every:
                continue  # a report not sampled: the shard hands on nothing
            f = 0.6 if name in slow else 1.0
            values = {
                "sm_clock_mhz": 1980 * f + rng.random(),
                "power_w": 650 * f + rng.random(),
                "gpu_util_pct": 95 + rng.random(),
                "nic_gbps": 350 * f + rng.random(),
            }
            if job:
                values["step_time_s"] = 2.0 / f + rng.random() / 100
            failslow.append(name, values, job)
            appends += 1
        append_s += time.perf_counter() - started
        changes: list[Any] = []
        running = failslow.evaluation_steps(changes)
        total = cpu_total = 0.0
        while True:
            started, cpu = time.perf_counter(), time.thread_time()
            finished = next(running, _DONE) is _DONE
            took, cpu_took = time.perf_counter() - started, time.thread_time() - cpu
            total += took
            cpu_total += cpu_took
            if tick >= window_ticks:
                steps.append(took)
                cpu_steps.append(cpu_took)
            if finished:
                break
        if tick >= window_ticks:
            evaluation_s.append(total)
            evaluation_cpu_s.append(cpu_total)
    return {
        "failslow_step_ms_mean": round(1000 * statistics.fmean(steps), 3),
        "failslow_step_ms_longest": round(1000 * max(steps), 2),
        "failslow_step_cpu_ms_mean": round(1000 * statistics.fmean(cpu_steps), 3),
        "failslow_step_cpu_ms_longest": round(1000 * max(cpu_steps), 2),
        "steps_per_evaluation": round(len(steps) / evaluations, 1),
        "evaluation_ms_median": round(1000 * statistics.median(evaluation_s), 2),
        "evaluation_cpu_ms_median": round(1000 * statistics.median(evaluation_cpu_s), 2),
        "append_us_per_sample": round(1e6 * append_s / max(1, appends), 2),
        "open_conditions": len(failslow.active()),
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.failslow_step", description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=10_000)
    ap.add_argument("--shape", nargs="+", choices=SHAPES, default=list(SHAPES))
    ap.add_argument("--evaluations", type=int, default=24, help="timed evaluations after the windows fill")
    args = ap.parse_args(argv)
    if args.nodes < 1 or args.evaluations < 1:
        ap.error("--nodes and --evaluations must be >= 1")
    quiet_logging()
    gcpolicy.tune()  # as the controller starts: no automatic full collection in the middle of a step
    figures: dict[str, Any] = {}
    for shape in args.shape:
        figures[shape] = run(shape, args.nodes, args.evaluations)
        rows = list(figures[shape].items())
        print(table(f"failslow_step, {args.nodes:,} nodes, shape {shape}", rows))
    params = {"nodes": args.nodes, "shapes": args.shape, "evaluations": args.evaluations}
    print(f"wrote {write_result(NAME, params, figures)}")
    return figures


if __name__ == "__main__":
    main()
