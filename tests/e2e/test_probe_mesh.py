"""The probe mesh end to end: a real controller plans and pushes the mesh, real agents probe
each other over loopback (UDP on per-rail 127.x addresses), and loss injected on one leaf of a
simulated data plane becomes one incident blaming that leaf, after a clean stretch with none."""

from __future__ import annotations

import socket
from pathlib import Path

from agent.probe.prober import Prober
from agent.sim.probe_fabric import SimProbeFabric
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.service import Controller, ControllerConfig
from tests.helpers import free_port, halt_agents, make_sim_agent, wait_for


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_agents_probe_each_other_and_a_lossy_leaf_is_blamed(tmp_path: Path) -> None:
    fabric = generate_fabric(6, gpus_per_node=8, rails=2, nodes_per_block=3, spines=2)
    probes = ProbeConfig(
        enabled=True,
        port=_udp_port(),
        window_s=1,
        timeout_ms=200,
        packets_per_s_per_nic=50.0,
        address_template="127.1{rail}.{block}.1{slot}",
        replan_min_s=0.0,
        rtt_threshold_us=50_000.0,  # a shared test machine's scheduling noise is not what this is about
    )
    port = free_port()
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{port}",
            http="127.0.0.1:0",
            db_path=tmp_path / "controller.db",
            sweep_interval_s=0.2,
            fabric=fabric,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=1.0), probes=probes),
        )
    )
    data_plane = SimProbeFabric(fabric.leaf_of, fabric.spines_of)
    await ctl.start()
    agents = [
        make_sim_agent(
            node, tmp_path, [f"127.0.0.1:{port}"], interval_s=0.5, seed=i, prober=Prober(fate=data_plane.fate)
        )
        for i, node in enumerate(fabric.nodes())
    ]
    try:
        for a in agents:
            a.start()
        await wait_for(
            lambda: all(a.agent.prober.plan.targets for a in agents), timeout=30, what="every agent holding its plan"
        )
        plan = agents[0].agent.prober.plan
        assert plan.listen["node-000/nic-1"] == "127.11.0.10" and plan.dscp == 26
        await wait_for(
            lambda: ctl.core.detection.probes is not None and len(ctl.core.detection.probes._window) > 30,
            timeout=30,
            what="probe results reaching the controller",
        )
        await wait_for(lambda: sum(a.agent.prober.answered_total for a in agents) > 500, what="probes answered")
        assert ctl.core.open_incidents() == []

        data_plane.inject_loss("leaf-b1-r0", 0.05)
        await wait_for(lambda: bool(ctl.core.open_incidents()), timeout=40, what="an incident")
        incidents = ctl.core.open_incidents()
        assert [(i.kind, i.root_cause) for i in incidents] == [("switch_fault", "leaf-b1-r0")]
        assert incidents[0].affected_nodes == []  # no node is blamed, none is evicted
    finally:
        await halt_agents(agents)
        await ctl.stop()
