"""The decision core driven alone, as a fleet simulator will: no gRPC, no real time.

An Xid 79 on one GPU becomes a gpu_fault incident, the node is evicted through the
in-memory scheduler, rebooted (the node's agent says hello with a new boot id), validated
and returned to service (the spare target is already met); every step happens on a FakeClock that the test advances.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.states import NodeHealState
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

NODE = "node-002"


def _hello(node: str, boot: int) -> spb.Hello:
    inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(2)])
    return spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id=f"boot-{boot}")


async def _agent(core: DecisionCore, boots: list[int]) -> None:
    """The node's end of the stream: a reboot command is answered by a hello with a new boot id."""
    while True:
        command = await core.registry.nodes[NODE].commands.get()
        if command.kind == spb.COMMAND_KIND_REBOOT:
            boots.append(boots[-1] + 1)
            core.hello(_hello(NODE, boots[-1]))
        else:
            core.registry.command_result(
                core.registry.nodes[NODE], spb.CommandResult(id=command.id, ok=True, message="done")
            )


async def test_fault_eviction_repair_and_return_on_the_fake_clock_alone(tmp_path: Path) -> None:
    fabric = generate_fabric(nodes=8, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1, spares=1)
    scheduler = SimScheduler([*fabric.nodes()])
    clock = FakeClock()
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,  # presence is not what this test is about
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0)),
        heal=HealSettings(
            scheduler=scheduler,
            guards=GuardConfig(mode="enforce"),
            heal=HealConfig(checkpoint_timeout_s=0.0, repair_poll_s=1.0),
        ),
    )
    store = Store(config.db_path)
    core = DecisionCore(config, clock, store, ControllerMetrics(), fabric=fabric)
    assert core.healer is not None and core.healer.repairs is not None
    for node in fabric.nodes():
        core.hello(_hello(node, 1))
    boots = [1]
    core.start()
    agent = asyncio.create_task(_agent(core, boots))
    started = clock.monotonic()
    try:
        await clock.run_for(1.0)
        xid = tpb.Event(
            seq=1,
            timestamp_ms=clock.time_ms(),
            kind=tpb.EVENT_KIND_XID,
            severity=tpb.SEVERITY_CRITICAL,
            component="gpu-1",
            xid=79,
            source="kmsg",
            message="NVRM: Xid (PCI:0000:9b:00): 79, GPU has fallen off the bus.",
        )
        assert core.events(NODE, [xid]) == [xid]
        await clock.run_for(10.0)
        incidents = core.detection.correlator.incidents(active_only=False)
        assert [(i.kind, i.affected_nodes) for i in incidents] == [("gpu_fault", [NODE])]
        heal = core.healer.store
        assert heal.state(NODE) in (NodeHealState.EVICTED, NodeHealState.REPAIRING, NodeHealState.VALIDATING)
        assert any(a[0] == "drain" and a[1] == NODE for a in scheduler.actions)
        for _ in range(20 * 60):  # at most 20 minutes of controller time, a second at a time
            for node in fabric.nodes():
                core.report(node, tpb.Report(seq=1, timestamp_ms=clock.time_ms()))
            await clock.run_for(1.0)
            if heal.state(NODE) in (NodeHealState.SPARE, NodeHealState.IN_SERVICE, NodeHealState.RETIRED):
                break
        # the fabric's own spare already meets the spare target (1): the node goes back to work
        assert heal.state(NODE) == NodeHealState.IN_SERVICE
        assert boots == [1, 2]  # one reboot
        assert any(a[0] == "resume" and a[1] == NODE for a in scheduler.actions)
        elapsed = clock.monotonic() - started
        assert 120.0 <= elapsed < 20 * 60  # the validation's quiet time passed on the clock, nothing more
    finally:
        agent.cancel()
        await core.stop()
        await core.stop_healing()
        store.close()


def test_job_progress_is_a_job_level_entry_apart_from_rank_samples(tmp_path: Path) -> None:
    """A job's own progress lands on its record; an older sample does not overwrite a newer one."""
    clock = FakeClock()
    store = Store(tmp_path / "c.db")
    try:
        core = DecisionCore(ControllerConfig(db_path=tmp_path / "c.db"), clock, store, ControllerMetrics())
        core.job_progress("llm", 120, at_ms=clock.time_ms(), phase="train")
        core.job_progress("llm", 100, at_ms=clock.time_ms() - 5_000, phase="train")  # late, older
        rec = core.jobs.job("llm")
        assert rec is not None and rec.progress is not None
        assert (rec.progress.step, rec.progress.phase, rec.progress.received_ms) == (120, "train", clock.time_ms())
        assert rec.ranks == {}  # no rank sample was made up
    finally:
        store.close()
