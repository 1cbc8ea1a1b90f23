"""Blame on evidence, not on counts (issue 29 item 4), through the decision core on a fake clock.

Two unrelated NIC failures 20 s apart under one leaf are two NIC incidents, each remediated;
never one leaf fault with the second NIC left alone. Two that start within one grouping window
are related (docs/runbook.md, "Related faults"), and so is a leaf its own probes blame.
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
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb


def _hello(node: str) -> spb.Hello:
    nics = [ipb.NicInfo(rdma_device=f"mlx5_{r}", port=1, netdev=f"rail{r}", paired_gpu_index=r) for r in range(2)]
    inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(2)], nics=nics)
    return spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="boot-1")


def _port_down(clock: FakeClock, seq: int) -> tpb.Event:
    return tpb.Event(
        seq=seq,
        timestamp_ms=clock.time_ms(),
        kind=tpb.EVENT_KIND_NIC_LINK_DOWN,
        severity=tpb.SEVERITY_CRITICAL,
        component="mlx5_0/1",
        message="mlx5_0 port 1 down",
    )


async def _run(core: DecisionCore, clock: FakeClock, nodes: list[str], seconds: int) -> None:
    for step in range(seconds):
        if step % 5 == 0:
            for node in nodes:
                core.report(node, tpb.Report(seq=1, timestamp_ms=clock.time_ms()))
        await clock.run_for(1.0)


async def test_two_unrelated_nic_failures_under_one_leaf_are_two_nic_incidents_each_remediated(
    tmp_path: Path,
) -> None:
    fabric = generate_fabric(nodes=8, gpus_per_node=2, rails=2, nodes_per_block=4, spines=2)
    scheduler = SimScheduler([*fabric.nodes()])
    clock = FakeClock()
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(min_nodes_for_switch=2)),
        heal=HealSettings(
            scheduler=scheduler,
            guards=GuardConfig(mode="enforce", max_fleet_share=0.5),  # 8 nodes: the default 5 % is one
            heal=HealConfig(checkpoint_timeout_s=0.0, repair_poll_s=1.0),
        ),
    )
    store = Store(config.db_path)
    core = DecisionCore(config, clock, store, ControllerMetrics(), fabric=fabric)
    for node in fabric.nodes():
        core.hello(_hello(node))
    core.start()
    try:
        await _run(core, clock, fabric.nodes(), 20)
        core.events("node-000", [_port_down(clock, 1)])  # leaf-b0-r0's first NIC
        await _run(core, clock, fabric.nodes(), 20)
        core.events("node-001", [_port_down(clock, 1)])  # the same leaf's second NIC, 20 s later
        await _run(core, clock, fabric.nodes(), 60)
        open_ = sorted((i.kind, i.root_cause) for i in core.open_incidents())
        assert open_ == [("nic_fault", "node-000/nic-0"), ("nic_fault", "node-001/nic-0")]
        drained = {a[1] for a in scheduler.actions if a[0] == "drain"}
        assert {"node-000", "node-001"} <= drained  # each NIC incident remediated on its own
    finally:
        await core.stop()
        await core.stop_healing()
        await asyncio.sleep(0)
        store.close()


async def test_two_nic_failures_in_one_window_under_one_leaf_are_the_leaf(tmp_path: Path) -> None:
    fabric = generate_fabric(nodes=8, gpus_per_node=2, rails=2, nodes_per_block=4, spines=2)
    clock = FakeClock()
    config = ControllerConfig(
        db_path=tmp_path / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(min_nodes_for_switch=2)),
    )
    store = Store(config.db_path)
    core = DecisionCore(config, clock, store, ControllerMetrics(), fabric=fabric)
    for node in fabric.nodes():
        core.hello(_hello(node))
    core.start()
    try:
        await _run(core, clock, fabric.nodes(), 20)
        core.events("node-000", [_port_down(clock, 1)])
        core.events("node-001", [_port_down(clock, 1)])
        await _run(core, clock, fabric.nodes(), 30)
        assert [(i.kind, i.root_cause) for i in core.open_incidents()] == [("switch_fault", "leaf-b0-r0")]
    finally:
        await core.stop()
        store.close()


def test_a_lagging_controller_opens_no_node_down_for_reports_it_has_not_read(tmp_path: Path) -> None:
    fabric = generate_fabric(nodes=4, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1)
    clock = FakeClock()
    config = ControllerConfig(db_path=tmp_path / "c.db", fabric=fabric, heartbeat_timeout_s=15.0)
    store = Store(config.db_path)
    core = DecisionCore(config, clock, store, ControllerMetrics(), fabric=fabric)
    try:
        for node in fabric.nodes():
            core.hello(_hello(node))

        def steady(seconds: int, *, silent: frozenset[str] = frozenset()) -> None:
            for step in range(seconds):
                clock.advance(1.0)
                if step % 5 == 0:
                    for node in fabric.nodes():
                        if node not in silent:
                            core.report(node, tpb.Report(seq=1, timestamp_ms=clock.time_ms()))
                core.tick()

        steady(30)
        clock.advance(40.0)  # the controller's process stood still 40 s (starved, paused)
        core.tick()  # its first sweep after: its own lag, not 4 nodes gone
        assert core.registry.lag_ms >= 39_000
        assert all(n.state == "online" for n in core.registry.nodes.values())
        steady(5)  # the reports that waited are read
        steady(25, silent=frozenset({"node-002"}))  # one node really is silent
        core.tick()
        states = {n: r.state for n, r in core.registry.nodes.items()}
        assert states == {"node-000": "online", "node-001": "online", "node-002": "unreachable", "node-003": "online"}
    finally:
        store.close()
