"""False hangs over 30 minutes of healthy training, on the fake clock: a DecisionCore with the
production hang settings (``HangConfig()``) judging eight ranks on four nodes that train with
jittered step times, write a checkpoint every 5 minutes (90 s in the checkpointing phase), run
an evaluation pass every 10 minutes (3 minutes), carry a straggler at 40 % pace, and lose one
node's agent for 60 s. Counts ``job_hang`` incidents (goal: 0) per seed.

    python -m bench.hang --false-hangs [--seeds 5] [--minutes 30]
"""

from __future__ import annotations

import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.jobs.hang import HangConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

NODES = [f"node-{i:03d}" for i in range(4)]
RANKS_PER_NODE = 2
REPORT_S = 5
STEP_S = 1.0
STRAGGLER = 2  # rank 2 (node-001) at 40 % pace
SILENT_NODE, SILENT_FROM_S, SILENT_FOR_S = "node-001", 1000, 60


@dataclass
class FalseHangRun:
    seed: int
    minutes: int
    job_hang_incidents: int
    steps_trained: int
    checkpoints: int
    evaluations: int


def phase_at(t: int) -> str:
    """Every 10 minutes: train 60 s, checkpoint 90 s, train 30 s, evaluate 180 s, checkpoint 90 s, train."""
    m = t % 600
    if 60 <= m < 150 or 360 <= m < 450:
        return "checkpointing"
    return "evaluating" if 180 <= m < 360 else "training"


def run_false_hangs(workdir: Path, seed: int, minutes: int = 30, stop_at_s: int | None = None) -> FalseHangRun:
    """``stop_at_s``: every rank stops there (the control: the same harness must then count a hang)."""
    rng = random.Random(seed)
    clock = FakeClock()
    config = ControllerConfig(
        db_path=workdir / "c.db",
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0)),
        hang=HangConfig(),
    )
    store = Store(config.db_path)
    core = DecisionCore(config, clock, store, ControllerMetrics())
    for node in NODES:
        inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(RANKS_PER_NODE)])
        core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="b1"))
    ranks = range(len(NODES) * RANKS_PER_NODE)
    step = dict.fromkeys(ranks, 0.0)
    pace = {r: (0.4 if r == STRAGGLER else 1.0) for r in ranks}
    phase, since = "training", 0
    checkpoints = evaluations = 0
    seq = 0
    for t in range(1, minutes * 60 + 1):
        clock.advance(1.0)
        now_phase = phase_at(t)
        if now_phase != phase:
            checkpoints += now_phase == "checkpointing"
            evaluations += now_phase == "evaluating"
            phase, since = now_phase, clock.time_ms()
        if stop_at_s is not None and t >= stop_at_s:
            pace = dict.fromkeys(ranks, 0.0)
        if phase == "training":
            for r in ranks:
                step[r] += pace[r] * rng.uniform(0.7, 1.3) / STEP_S
        if t % REPORT_S == 0:
            seq += 1
            for n, node in enumerate(NODES):
                if node == SILENT_NODE and SILENT_FROM_S <= t < SILENT_FROM_S + SILENT_FOR_S:
                    continue  # its agent restarts: no report at all
                report = tpb.Report(seq=seq, timestamp_ms=clock.time_ms())
                for r in ranks:
                    if r // RANKS_PER_NODE == n:
                        report.job_steps.add(
                            job="llm", rank=r, step=int(step[r]), step_time_s=STEP_S / (pace[r] or 1.0), pid=1000 + r,
                            world_size=len(step), phase=phase, phase_since_ms=since,
                        )  # fmt: skip
                core.report(node, report)
        core.tick()
    hangs = [i for i in core.detection.correlator.incidents(active_only=False) if i.kind == "job_hang"]
    store.close()
    return FalseHangRun(seed, minutes, len(hangs), int(min(step.values())), checkpoints, evaluations)


def run_seeds(seeds: int, minutes: int) -> list[FalseHangRun]:
    out = []
    for seed in range(seeds):
        with tempfile.TemporaryDirectory(prefix="sp-falsehang-", dir="/tmp") as d:
            out.append(run_false_hangs(Path(d), seed, minutes))
    return out
