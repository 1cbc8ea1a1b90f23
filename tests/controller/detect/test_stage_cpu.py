"""The report path's CPU by stage (controller.metrics.StageCpu), and a verdict's wire form.

bench.scale prints the split so that the next regression names itself (issue 31); these
tests pin what it reads: the exposition's series, a shard's own split, and that a verdict
crosses the shard pipe whole.
"""

from __future__ import annotations

import pickle
import time

from prometheus_client import generate_latest

from controller.detect.shard_worker import PHASES, stage_totals
from controller.ingest.verdict import ReportResult
from controller.metrics import ControllerMetrics, StageCpu
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb


def _burn() -> None:
    sum(i * i for i in range(20_000))


def test_a_stage_is_charged_with_the_thread_cpu_it_spent() -> None:
    cpu = StageCpu()
    at = cpu.since("idle", time.thread_time())
    _burn()
    cpu.since("busy", at)
    assert cpu.seconds["busy"] > 0
    assert set(cpu.seconds) == {"idle", "busy"}


def test_the_exposition_names_process_and_stage() -> None:
    metrics = ControllerMetrics()
    metrics.stage_cpu.seconds["verdicts"] = 1.5
    metrics.shard_stage_cpu[1] = {"rules": 2.25}
    text = generate_latest(metrics.registry).decode()
    assert 'starpulse_stage_cpu_seconds_total{process="main",stage="verdicts"} 1.5' in text
    assert 'starpulse_stage_cpu_seconds_total{process="shard-1",stage="rules"} 2.25' in text


def test_a_shard_splits_its_batches_cpu_by_the_reports_phases() -> None:
    """The batches' CPU goes to decode/validate, rules and fail-slow in proportion to their wall
    time; what the phases do not cover stays with the batch; the frame stages are kept."""
    totals = stage_totals({"decide": 10.0, "frame_read": 1.0, "tick": 0.5}, [2.0, 5.0, 1.0], 10.0)
    assert totals["frame_read"] == 1.0 and totals["tick"] == 0.5
    assert [totals[p] for p in PHASES] == [2.0, 5.0, 1.0]
    assert totals["decide_other"] == 2.0
    assert "decide" not in totals
    assert stage_totals({}, [0.0, 0.0, 0.0], 0.0) == {"decide_other": 0.0}


def test_a_verdict_crosses_the_shard_wire_whole() -> None:
    verdict = ReportResult(
        "node-1",
        7,
        12.5,
        seq=42,
        timestamp_ms=1_700_000_000_000,
        full_report_needed=True,
        signals={"gpu_util": 0.9},
        job="job-a",
        job_steps=[tpb.JobStepSample(job="job-a", rank=3, step=10, step_time_s=0.5)],
        lldp=[ipb.LldpNeighbor(local_interface="eth0", chassis_id="leaf-1", port_id="Ethernet1")],
        gpus=8,
        nics=9,
    )
    wire = pickle.loads(pickle.dumps(verdict.to_wire(), protocol=pickle.HIGHEST_PROTOCOL))
    assert type(wire) is tuple
    assert ReportResult.from_wire(wire) == verdict


def test_bench_scale_splits_the_cpu_per_report_by_where_it_went() -> None:
    """What bench.scale prints: the loop's stages from the series, the loop's rest, gRPC's
    threads and the shard processes from outside, all in microseconds per decided report."""
    from bench.scale import cpu_split

    key = 'starpulse_stage_cpu_seconds_total{{process="{}",stage="{}"}}'
    before = {key.format("main", "verdicts"): 1.0, key.format("shard-0", "rules"): 2.0}
    after = {
        key.format("main", "verdicts"): 1.2,
        key.format("shard-0", "rules"): 2.5,
        key.format("shard-1", "rules"): 0.5,
    }
    ctl = {"own_cpu_s": 0.5, "main_thread_cpu_s": 0.4, "children_cpu_s": {"11": 0.6, "12": 0.6}}
    split = cpu_split(before, after, ctl, reports=1000)
    assert split["main: gRPC and other threads"] == 100.0
    assert split["main loop: verdicts"] == 200.0
    assert split["main loop: other (asyncio, gRPC reads, HTTP)"] == 200.0
    assert split["shards, all (processes)"] == 1200.0
    assert split["shards: rules"] == 1000.0  # 0.5 s on shard 0, 0.5 s on shard 1 (new since before)
    assert split["shards: other (select, GC)"] == 200.0
    assert cpu_split(before, after, ctl, reports=0) == {}
