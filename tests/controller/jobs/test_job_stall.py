"""Hangs without the job library: simulated nodes (fake NVML and sysfs read by the real
collectors) report a Slurm job's GPUs busy at idle power and their RDMA counters flat; the
decision core on a FakeClock opens the same ``job_hang`` incident the job library's path does."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from agent.commands import CommandHandler
from agent.factory import build_collectors
from agent.sim.node import SimNode
from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.failslow import FailSlowConfig
from controller.detect.model import Incident
from controller.detect.pipeline import DetectionConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

REPORT_S = 5


class Fleet:
    """Four simulated nodes whose real collectors report to a decision core every REPORT_S."""

    def __init__(self, tmp_path: Path) -> None:
        self.clock = FakeClock()
        config = ControllerConfig(
            db_path=tmp_path / "c.db",
            heartbeat_timeout_s=3600.0,
            detection=DetectionConfig(
                correlation=CorrelationConfig(settle_s=2.0),
                failslow=FailSlowConfig(sample_every_s=10.0, window_s=120.0),
            ),
        )
        self.core = DecisionCore(config, self.clock, Store(config.db_path), ControllerMetrics())
        self.sims: dict[str, SimNode] = {}
        self.plans = {}
        for i in range(4):
            name = f"node-{i:03d}"
            sim = self.sims[name] = SimNode(name, tmp_path / name, gpus=2, nics=2, seed=i)
            plan = self.plans[name] = build_collectors("sim", None, sim=sim, kmsg_path=None, lldp=False)
            inv = ipb.Inventory()
            for c in plan.collectors:
                assert c.supported()
                c.describe(inv)
            self.core.hello(spb.Hello(node_id=name, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="b1"))
            sim.run_job("4242", pid_base=40_000 + 100 * i)  # a Slurm job on every GPU, no job library
        self.seq = 0

    def run(self, seconds: int) -> None:
        for t in range(1, seconds + 1):
            self.clock.advance(1.0)
            if t % REPORT_S == 0:
                self.seq += 1
                for name, sim in self.sims.items():
                    sim.advance(REPORT_S)
                    report = tpb.Report(seq=self.seq, timestamp_ms=self.clock.time_ms())
                    for c in self.plans[name].collectors:
                        c.collect(report)
                    self.core.report(name, report)
            self.core.tick()

    def hangs(self) -> list[Incident]:
        return [i for i in self.core.detection.correlator.incidents(active_only=False) if i.kind == "job_hang"]


def test_a_collective_stall_on_every_node_of_the_job_opens_job_hang_within_a_minute(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.run(60)  # training: busy GPUs at full power, traffic on the NICs
    assert fleet.hangs() == []
    for sim in fleet.sims.values():
        sim.collective_stall(True)
    stalled_ms = fleet.clock.time_ms()
    fleet.run(70)
    [incident] = fleet.hangs()
    assert incident.root_cause == "job:4242" and incident.active
    assert sorted(incident.affected_nodes) == sorted(fleet.sims)
    evidence = incident.evidence[0]["evidence"]
    assert evidence["source"] == "gpu_signature" and evidence["suspects"] == []
    assert all(n["min_util_pct"] >= 95 and n["max_power_fraction"] <= 0.25 for n in evidence["per_node"])
    assert incident.opened_ms - stalled_ms <= 60_000
    for sim in fleet.sims.values():  # the job moves again: the condition resolves
        sim.collective_stall(False)
    fleet.run(30)
    assert not fleet.core.stalls.active()


def test_a_stall_on_some_nodes_of_the_job_only_is_not_a_job_hang(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.run(30)
    for name in ("node-000", "node-001"):
        fleet.sims[name].collective_stall(True)
    fleet.run(120)
    assert fleet.hangs() == []


def test_busy_gpus_at_full_power_with_quiet_nics_are_not_a_hang(tmp_path: Path) -> None:
    # A compute-bound phase (no communication for a while) keeps power high: not the signature.
    fleet = Fleet(tmp_path)
    fleet.run(30)
    for sim in fleet.sims.values():
        with sim._lock:
            sim._throughput = [0.0] * sim.nics
    fleet.run(120)
    assert fleet.hangs() == []


async def test_a_stall_without_the_job_library_asks_the_nodes_for_the_job_processes_stacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agents find the hung job's ranks by its Slurm id among their GPU processes (no job
    gateway knows it) and answer COLLECT_STACKS; without py-spy every rank is listed as unread,
    and the hang's evidence says so instead of naming anyone."""
    monkeypatch.setenv("PATH", "/nonexistent")  # no py-spy: the answer is the ranks, unread
    fleet = Fleet(tmp_path)
    handlers = {
        name: CommandHandler(None, job_pids=next(c.pids_of for c in plan.collectors if hasattr(c, "pids_of")))
        for name, plan in fleet.plans.items()
    }

    async def agent(name: str) -> None:
        record = fleet.core.registry.nodes[name]
        while True:
            command = await record.commands.get()
            fleet.core.registry.command_result(record, await handlers[name](command))

    agents = [asyncio.create_task(agent(n)) for n in fleet.sims]
    try:
        fleet.run(30)
        for sim in fleet.sims.values():
            sim.collective_stall(True)
        for _ in range(14):  # 70 s, a report interval at a time, the agents answering in between
            fleet.run(REPORT_S)
            await fleet.clock.run_for(0.0)
        [cond] = fleet.core.stalls.active()
        stacks = cond.evidence["stacks"]
        assert stacks["reason"] == "no stack could be read"
        assert sorted((u["node"], u["rank"]) for u in stacks["unread"]) == sorted(
            (n, r) for n in fleet.sims for r in range(2)
        )
        assert cond.evidence["suspects"] == []
    finally:
        for task in agents:
            task.cancel()
