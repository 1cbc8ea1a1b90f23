"""The probe mesh's fault kinds over gRPC with the controller on a fake clock.

A real controller (gRPC on loopback, its sweep loop, detection, correlation and healer on a
FakeClock) and the scenario cluster's real agents: each takes its probe plan on its stream and
reports windows drawn from the cluster's data plane, closed on the controller's fake clock. The
test moves the fake clock a second at a time, and only once every agent has reported at the
present moment, so the controller's default windows (10 s agent window, localisation every 5 s
over 30 s) pass in a few real seconds however slowly the agents run. Not a fixed real-time
sleep per second: under load the agents fell seconds behind the fake clock, the localiser
rightly left out the nodes gone quiet (heard within 1.5 report intervals), and on what was left
(one NIC under the lossy leaf) a NIC and its leaf had the same votes and rate.

A silent drop on a leaf is one switch_fault on that leaf with no node taken out; a lossy NIC
cable is a nic_fault on that NIC, whose node the healer drains; each resolves once its fault
is cleared.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from controller.detect.pipeline import DetectionConfig
from controller.fabric.probeplan import ProbeConfig
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.app.scenario.cluster import SimCluster
from starpulse.app.scenario.spec import parse_scenario
from starpulse.core.clock import FakeClock

FABRIC = {"nodes": 8, "gpus_per_node": 4, "rails": 4, "nodes_per_block": 4, "spines": 2}


# The controller sweeps (and localises) on whole seconds of its clock (sweep_interval_s 1 s): the
# clock stops this far short of each, until every agent's report of that moment is in.
EDGE_S = 0.001
REPORT_WAIT_S = 30.0  # real seconds an agent may take to report (a loaded machine), else the test fails


async def _reported(ctl: Controller, clock: FakeClock, nodes: list[str]) -> None:
    """Real time until the controller has taken in a report from every agent at the clock's present."""
    now = clock.time_ms()
    give_up = time.monotonic() + REPORT_WAIT_S
    while True:
        behind = [n for n in nodes if (rec := ctl.registry.nodes.get(n)) is None or rec.last_seen_ms < now]
        if not behind:
            return
        assert time.monotonic() < give_up, f"no report at {now} ms within {REPORT_WAIT_S} s from {behind}"
        await asyncio.sleep(0.01)


async def _until(ctl: Controller, clock: FakeClock, nodes: list[str], what: Any, limit_s: int) -> bool:
    """Move the fake clock a second at a time, each sweep once every agent has reported just before it."""
    for _ in range(limit_s):
        await clock.run_for(1.0 - EDGE_S)
        await _reported(ctl, clock, nodes)
        await clock.run_for(EDGE_S)
        if what():
            return True
    return False


@pytest.mark.slow
@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("fault", "expected", "drained"),
    [
        ({"kind": "switch_silent_drop", "target": "leaf-b1-r2", "loss": 0.02}, ("switch_fault", "leaf-b1-r2"), []),
        (
            {"kind": "nic_cable_loss", "target": "node-002/nic-1", "loss": 0.02},
            ("nic_fault", "node-002/nic-1"),
            ["node-002"],
        ),
    ],
    ids=["silent-drop-leaf", "nic-cable"],
)
async def test_a_probe_fault_over_grpc_on_the_fake_clock(
    tmp_path: Path, fault: dict[str, Any], expected: tuple[str, str], drained: list[str]
) -> None:
    scenario = parse_scenario(
        {"name": "g", "fabric": FABRIC, "duration_s": 600, "faults": [{"at_s": 0, **fault}]}, "mem"
    )
    fabric = scenario.build_fabric()
    scheduler = SimScheduler([*fabric.nodes()])
    clock = FakeClock()
    ctl = Controller(
        ControllerConfig(
            listen="127.0.0.1:0",
            http="127.0.0.1:0",
            db_path=tmp_path / "c.db",
            fabric=fabric,
            heartbeat_timeout_s=3600.0,  # presence on a clock racing real reports is not what this is about
            detection=DetectionConfig(probes=ProbeConfig(enabled=True, replan_min_s=0.0)),
            heal=HealSettings(
                scheduler=scheduler,
                guards=GuardConfig(mode="enforce"),
                heal=HealConfig(checkpoint_timeout_s=0.0, repair_poll_s=1.0),
            ),
        ),
        clock=clock,
    )
    await ctl.start()
    cluster = SimCluster(scenario, tmp_path, f"127.0.0.1:{ctl.grpc_port}", 0.2, probe_clock=clock.monotonic)
    correlator = ctl.detection.correlator
    try:
        await cluster.start()
        nodes = [*fabric.nodes()]
        planned = await _until(
            ctl, clock, nodes, lambda: all(cluster.agents[n].prober.plan.targets for n in nodes), 120
        )
        assert planned, "every agent holds its plan"
        await _until(ctl, clock, nodes, lambda: False, 60)  # a clean minute on the controller's clock
        assert correlator.incidents(active_only=False) == []

        cluster.inject(scenario.faults[0])
        assert await _until(ctl, clock, nodes, lambda: bool(correlator.incidents(active_only=True)), 180), "detected"
        await _until(ctl, clock, nodes, lambda: False, 20)  # the healer acts; nothing else opens meanwhile
        assert [(i.kind, i.root_cause) for i in correlator.incidents(active_only=False)] == [expected]
        assert sorted({n for a, n, _ in scheduler.actions if a == "drain"}) == drained

        cluster.clear(scenario.faults[0])
        assert await _until(ctl, clock, nodes, lambda: not correlator.incidents(active_only=True), 300), "resolved"
        assert [(i.kind, i.root_cause) for i in correlator.incidents(active_only=False)] == [expected]
    finally:
        await cluster.stop()
        await ctl.stop()
