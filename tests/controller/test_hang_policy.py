"""What the healer does about a hang, on a FakeClock with the in-memory scheduler: requeue the
job without the node its evidence names (drained, a spare in its place, the repair ladder), or
restart it in place when none is named, capped per job before a person is called."""

from __future__ import annotations

from pathlib import Path

from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.states import NodeHealState
from controller.jobs.hang import HangConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

JOB = "llm"


class HealCluster:
    """Four job nodes (two ranks each) and a spare; ranks step every second until stopped."""

    def __init__(self, tmp_path: Path, mode: str = "enforce", restarts_in_place: int = 2) -> None:
        self.fabric = generate_fabric(nodes=4, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1, spares=1)
        self.nodes = [n for n in self.fabric.nodes() if n != self.fabric.spares()[0]] if self.fabric.spares() else []
        self.scheduler = SimScheduler(list(self.fabric.nodes()))
        self.job_nodes = sorted(self.fabric.nodes())[:4]
        self.scheduler.add_job(JOB, self.job_nodes)
        self.clock = FakeClock()
        config = ControllerConfig(
            db_path=tmp_path / "c.db",
            fabric=self.fabric,
            heartbeat_timeout_s=3600.0,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0)),
            hang=HangConfig(stacks_timeout_s=5.0),
            heal=HealSettings(
                scheduler=self.scheduler,
                guards=GuardConfig(mode=mode),  # type: ignore[arg-type]
                heal=HealConfig(checkpoint_timeout_s=0.0, hang_restarts_in_place=restarts_in_place),
            ),
        )
        self.store = Store(config.db_path)
        self.core = DecisionCore(config, self.clock, self.store, ControllerMetrics(), fabric=self.fabric)
        for node in self.fabric.nodes():
            inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(2)])
            self.core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="b1"))
        self.step = {r: 0.0 for r in range(8)}
        self.pace = dict.fromkeys(self.step, 1.0)
        self.pid = 1000
        self.elapsed = 0

    def node_of(self, rank: int) -> str:
        return self.job_nodes[rank // 2]

    async def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.elapsed += 1
            for rank, pace in self.pace.items():
                self.step[rank] += pace
            if self.elapsed % 5 == 0:
                for node in self.fabric.nodes():
                    report = tpb.Report(seq=self.elapsed, timestamp_ms=self.clock.time_ms())
                    for rank, step in self.step.items():
                        if self.node_of(rank) == node:
                            report.job_steps.add(job=JOB, rank=rank, step=int(step), step_time_s=1.0,
                                                 pid=self.pid + rank, world_size=8, phase="training",
                                                 last_checkpoint_step=10, checkpoint_path="/ck/step-10")  # fmt: skip
                    self.core.report(node, report)
            await self.clock.run_for(1.0)

    def restart(self) -> None:
        """The job runs again (a new run of every rank: new pids), from its checkpoint at step 10."""
        self.pid += 100
        self.step = dict.fromkeys(self.step, 10.0)
        self.pace = dict.fromkeys(self.step, 1.0)

    async def __aenter__(self) -> HealCluster:
        self.core.start()
        await self.run(60)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.core.stop()
        await self.core.stop_healing()
        self.store.close()


async def test_a_named_node_is_evicted_and_the_job_requeued_without_it(tmp_path: Path) -> None:
    async with HealCluster(tmp_path) as c:
        c.pace[5] = 0.0  # rank 5 stops first; its peers finish two more steps, then wait for it
        await c.run(2)
        c.pace = dict.fromkeys(c.pace, 0.0)
        await c.run(60)  # the hang, its stacks unanswered (no agents): the steps name rank 5
        suspect = c.node_of(5)
        assert c.core.healer is not None
        assert c.core.healer.store.state(suspect) in (NodeHealState.EVICTED, NodeHealState.REPAIRING)
        assert ("drain", suspect) in [(a[0], a[1]) for a in c.scheduler.actions]
        requeues = [a for a in c.scheduler.actions if a[0] == "requeue"]
        assert requeues and suspect not in requeues[-1][2].split(",")
        rec = c.core.jobs.job(JOB)
        assert rec is not None and rec.restarts == 1 and rec.resumed_from_step == 10
        assert rec.steps_lost > 0  # counted: interrupted at the hang's step, resumed from 10


async def test_no_node_named_restarts_in_place_and_the_cap_calls_a_person(tmp_path: Path) -> None:
    async with HealCluster(tmp_path, restarts_in_place=1) as c:
        c.pace = dict.fromkeys(c.pace, 0.0)  # every rank stops at the same step: nobody named
        await c.run(60)
        assert c.core.healer is not None
        requeues = [a for a in c.scheduler.actions if a[0] == "requeue"]
        assert len(requeues) == 1 and sorted(requeues[0][2].split(",")) == c.job_nodes  # in place
        assert not [a for a in c.scheduler.actions if a[0] == "drain"]  # nobody evicted
        rec = c.core.jobs.job(JOB)
        assert rec is not None and rec.restarts == 1
        c.restart()
        await c.run(90)  # it runs again past its checkpoint; the first hang resolves
        c.pace = dict.fromkeys(c.pace, 0.0)  # and hangs again at the same place: a bug in the job
        await c.run(60)
        assert len([a for a in c.scheduler.actions if a[0] == "requeue"]) == 1  # not restarted again
        held = [d for d in c.core.healer.decisions if d.get("outcome") == "restart_cap_reached"]
        assert held and "calling a person" in held[0]["reason"]


async def test_dry_run_restarts_nothing(tmp_path: Path) -> None:
    async with HealCluster(tmp_path, mode="dry_run") as c:
        c.pace = dict.fromkeys(c.pace, 0.0)
        await c.run(60)
        assert c.core.healer is not None
        assert not [a for a in c.scheduler.actions if a[0] in ("requeue", "drain")]
        assert [d["outcome"] for d in c.core.healer.decisions if d["kind"] == "job_hang"] == ["dry_run"]
