"""The probe mesh's fault kinds, from the scenario format to a decision and back, on a fake clock.

Each kind is parsed from a scenario and injected through the simulated cluster's fault table
(``SimCluster.inject``, the cluster not started: only its data plane is used) into the
simulated data plane. The real decision core plans the mesh; every node's report carries the
results its pushed plan draws from that data plane (``SimProbeFabric.window_results``, what
the real prober sums per window), at the controller's default settings. The incident's kind,
the component blamed and the healer's action (an eviction for a NIC, a cordon for a host,
none for the fabric) are checked, then the fault is cleared and the incident must resolve.
The same kinds over real agents, real probers and gRPC are the suite's ``probe-*`` scenarios.
"""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from controller.core import DecisionCore
from controller.detect.pipeline import DetectionConfig
from controller.fabric.probeplan import ProbeConfig
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.app.scenario.cluster import SimCluster
from starpulse.app.scenario.spec import ScenarioError, parse_scenario
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

FABRIC = {"nodes": 8, "gpus_per_node": 4, "rails": 4, "nodes_per_block": 4, "spines": 2}
REPORT_S = 5  # the agents' report interval; each report carries the window that closed last

# kind, target, parameters, (incident kind, root cause), the healer's scheduler action on a node (None: none)
CASES: list[tuple[str, str, dict[str, Any], tuple[str, str], str | None]] = [
    ("switch_silent_drop", "leaf-b1-r2", {"loss": 0.01}, ("switch_fault", "leaf-b1-r2"), None),
    ("switch_silent_drop", "spine-1", {"loss": 0.02}, ("switch_fault", "spine-1"), None),
    ("link_loss", "spine-1<->leaf-b0-r3", {"loss": 0.01}, ("link_fault", "leaf-b0-r3<->spine-1"), None),
    ("link_delay", "leaf-b1-r0<->spine-0", {"delay_ms": 2.0}, ("link_fault", "leaf-b1-r0<->spine-0"), None),
    ("host_net_delay", "node-006", {"delay_ms": 2.0}, ("host_fault", "node-006"), "node-006"),
    ("nic_cable_loss", "node-005/nic-1", {"loss": 0.01}, ("nic_fault", "node-005/nic-1"), "node-005"),
    ("link_loss", "node-002/nic-1<->leaf-b0-r1", {"loss": 0.02}, ("nic_fault", "node-002/nic-1"), "node-002"),
]


class Fleet:
    """The decision core with its healer, and every node's reports drawn from the cluster's data plane."""

    def __init__(self, tmp_path: Path, fault: dict[str, Any]) -> None:
        scenario = parse_scenario({"name": "p", "fabric": FABRIC, "duration_s": 600, "faults": [fault]}, "mem")
        assert scenario.probes  # a fault only probes see turns the mesh on
        self.fault = scenario.faults[0]
        self.cluster = SimCluster(scenario, tmp_path, "127.0.0.1:9")
        self.fabric = self.cluster.fabric
        self.scheduler = SimScheduler([*self.fabric.nodes()])
        self.clock = FakeClock()
        self.probes = ProbeConfig(enabled=True)  # the controller's defaults: 500 us, 0.5 %, 30 s windows
        config = ControllerConfig(
            db_path=tmp_path / "c.db",
            fabric=self.fabric,
            heartbeat_timeout_s=3600.0,  # presence is not what this is about
            detection=DetectionConfig(probes=self.probes),
            heal=HealSettings(
                scheduler=self.scheduler,
                guards=GuardConfig(mode="enforce"),
                heal=HealConfig(checkpoint_timeout_s=0.0, repair_poll_s=1.0),
            ),
        )
        self.store = Store(config.db_path)
        self.core = DecisionCore(config, self.clock, self.store, ControllerMetrics(), fabric=self.fabric)
        for node in self.fabric.nodes():
            self.core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory()))
        self.rng = random.Random(7)
        self.seq = 0
        self.t = 0

    async def run(self, seconds: int) -> None:
        plane = self.cluster.data_plane
        for _ in range(seconds):
            await self.clock.run_for(1.0)
            self.t += 1
            if self.t % REPORT_S:
                continue
            self.seq += 1
            for node in self.fabric.nodes():
                plan = self.core.registry.nodes[node].probe_plan
                report = tpb.Report(seq=self.seq, timestamp_ms=self.clock.time_ms())
                if plan is not None and self.t % self.probes.window_s == 0:
                    report.probe_results.extend(plane.window_results(plan, self.rng))
                self.core.report(node, report)

    async def until(self, what: Any, limit_s: int) -> bool:
        for _ in range(limit_s):
            await self.run(1)
            if what():
                return True
        return False

    def incidents(self) -> list[tuple[str, str]]:
        return [(i.kind, i.root_cause) for i in self.core.detection.correlator.incidents(active_only=False)]

    def drained(self) -> list[str]:
        return sorted({node for action, node, _ in self.scheduler.actions if action == "drain"})


@pytest.mark.slow  # ~155 s for the seven cases under load (CI runs slow tests too: .ci/run, the README's command)
@pytest.mark.timeout(240)  # up to nine minutes of the fleet's time, a second at a time, on a loaded machine
@pytest.mark.parametrize(
    ("kind", "target", "params", "expected", "evicted"), CASES, ids=[f"{c[0]}-{c[1]}" for c in CASES]
)
async def test_a_probe_fault_is_found_blamed_acted_on_and_resolved(
    tmp_path: Path, kind: str, target: str, params: dict[str, Any], expected: tuple[str, str], evicted: str | None
) -> None:
    fleet = Fleet(tmp_path, {"at_s": 0, "kind": kind, "target": target, **params})
    fleet.core.start()
    try:
        await fleet.run(60)  # a clean minute: every window full, nothing blamed
        assert fleet.incidents() == []
        assert all(fleet.core.registry.nodes[n].probe_plan is not None for n in fleet.fabric.nodes())

        fleet.cluster.inject(fleet.fault)
        assert await fleet.until(lambda: bool(fleet.incidents()), 180), f"{kind} on {target} not detected"
        await fleet.run(30)  # the healer acts, and nothing else opens meanwhile
        assert fleet.incidents() == [expected]
        incident = fleet.core.detection.correlator.incidents(active_only=False)[0]
        assert incident.evidence, "the probes' evidence is in the incident"
        assert fleet.drained() == ([evicted] if evicted else [])  # the fabric's faults take no node out

        fleet.cluster.clear(fleet.fault)
        assert not fleet.cluster.data_plane.loss and not fleet.cluster.data_plane.delay_s
        resolved = await fleet.until(lambda: not fleet.core.detection.correlator.incidents(active_only=True), 300)
        assert resolved, f"{expected} still open five minutes after the fault cleared"
        assert fleet.incidents() == [expected]  # it resolved; nothing else opened
    finally:
        await fleet.core.stop()
        await fleet.core.stop_healing()
        fleet.store.close()
        await fleet.cluster.stop()


async def test_overlapping_probe_faults_hold_the_data_plane_until_the_last_clears(tmp_path: Path) -> None:
    """Two faults on one leaf's loss: the first sets it, clearing it leaves the second's, the last takes it away."""
    scenario = parse_scenario(
        {
            "name": "p",
            "fabric": FABRIC,
            "duration_s": 60,
            "faults": [
                {"at_s": 1, "kind": "switch_silent_drop", "target": "leaf-b0-r0", "loss": 0.02},
                {"at_s": 2, "kind": "switch_silent_drop", "target": "leaf-b0-r0", "loss": 0.05},
                {"at_s": 3, "kind": "link_delay", "target": "leaf-b0-r0<->spine-0", "delay_ms": 3},
            ],
        },
        "mem",
    )
    cluster = SimCluster(scenario, tmp_path, "127.0.0.1:9")
    plane = cluster.data_plane
    first, second, delay = scenario.faults
    try:
        for fault in scenario.faults:
            cluster.inject(fault)
        assert plane.loss == {"leaf-b0-r0": 0.02} and plane.delay_s == {"leaf-b0-r0<->spine-0": 0.003}
        cluster.clear(first)
        assert plane.loss == {"leaf-b0-r0": 0.02}  # the second still holds it
        cluster.clear(second)
        assert plane.loss == {} and plane.delay_s == {"leaf-b0-r0<->spine-0": 0.003}
        cluster.clear(delay)
        assert plane.delay_s == {}
    finally:
        await cluster.stop()


@pytest.mark.parametrize(
    ("fault", "extra", "message"),
    [
        (
            {"kind": "switch_silent_drop", "target": "node-003"},
            {},
            "faults[0].target: switch_silent_drop takes a switch, not a node ('node-003')",
        ),
        (
            {"kind": "link_loss", "target": "leaf-b0-r0<->spine-9"},
            {},
            "faults[0].target: link end 'spine-9' is not in the fabric",
        ),
        (
            {"kind": "nic_cable_loss", "target": "node-003/nic-1", "loss": 0.7},
            {},
            "faults[0].loss: must be a number in (0, 0.5], got 0.7",
        ),
        (
            {"kind": "host_net_delay", "target": "node-003", "delay_ms": 0},
            {},
            "faults[0].delay_ms: must be a number in (0, 400], got 0",
        ),
        (
            {"kind": "link_delay", "target": "leaf-b0-r0<->spine-0"},
            {"probes": False},
            "faults[0].kind: link_delay is seen only by probes, and `probes` is false",
        ),
    ],
    ids=["switch-not-node", "no-such-cable", "loss-too-high", "no-delay", "probes-off"],
)
def test_a_bad_probe_fault_is_one_line_naming_file_fault_and_key(
    fault: dict[str, Any], extra: dict[str, Any], message: str
) -> None:
    data = {"name": "p", "fabric": FABRIC, "duration_s": 60, "faults": [{"at_s": 1, **fault}], **extra}
    with pytest.raises(ScenarioError) as info:
        parse_scenario(data, "scenarios/bad.yaml")
    text = str(info.value)
    assert text.startswith(f"scenarios/bad.yaml: {message}"), text
    assert "\n" not in text


def test_probing_is_on_only_where_a_scenario_needs_it() -> None:
    base = {"name": "p", "fabric": FABRIC, "duration_s": 60}
    assert not parse_scenario(base, "mem").probes
    assert parse_scenario({**base, "probes": True}, "mem").probes  # a clean fabric, probed: nothing may open
    nic = {"at_s": 1, "kind": "nic_down", "target": "node-000/nic-0"}
    assert not parse_scenario({**base, "faults": [nic]}, "mem").probes


def test_a_bad_probe_fault_at_the_command_line(tmp_path: Path) -> None:
    """`starpulse scenario run` on a probe fault aimed at the wrong thing: exit 2, one line."""
    path = tmp_path / "bad.yaml"
    fault = {"at_s": 1, "kind": "host_net_delay", "target": "leaf-b0-r0"}
    path.write_text(yaml.safe_dump({"name": "p", "fabric": FABRIC, "duration_s": 60, "faults": [fault]}))
    out = subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", "scenario", "run", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr.strip().splitlines() == [
        f"starpulse scenario run: {path}: faults[0].target: host_net_delay takes a node, not a switch ('leaf-b0-r0')"
    ]
