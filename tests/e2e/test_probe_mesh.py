"""The probe mesh end to end: a real controller plans and pushes the mesh, real agents probe
each other over loopback (UDP on per-rail 127.x addresses), and loss injected on one leaf of a
simulated data plane becomes one incident blaming that leaf, after a clean stretch (a full
localisation window with every node's results counting) with none."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

from agent.probe.prober import Prober
from agent.sim.probe_fabric import SimProbeFabric
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port, halt_agents, make_sim_agent, wait_for


def _udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# Loopback addresses of this run's own: the plan's source ports are fixed per NIC name, so two
# runs of this test at once on one machine (two checkouts, two helpers) with the same addresses
# fail each other's binds ("Address already in use") and probe nothing from those NICs.
_OCTET = 2 + os.getpid() % 250
_TEMPLATE = f"127.{_OCTET}.1{{block}}{{rail}}.1{{slot}}"


def _evidence(ctl: Controller) -> str:
    return "\n".join(f"{i.kind} {i.root_cause}: {i.evidence}" for i in ctl.core.open_incidents())


async def test_agents_probe_each_other_and_a_lossy_leaf_is_blamed(tmp_path: Path) -> None:
    fabric = generate_fabric(6, gpus_per_node=8, rails=2, nodes_per_block=3, spines=2)
    probes = ProbeConfig(
        enabled=True,
        port=_udp_port(),
        window_s=1,
        # A starved responder thread on a loaded test machine answers late, not never: a 200 ms
        # timeout (and, at a load average of 26 on two cores, 1 s) counted its late replies as
        # loss, a host fault on the clean stretch.
        timeout_ms=3000,
        packets_per_s_per_nic=50.0,
        address_template=_TEMPLATE,
        replan_min_s=0.0,
        # Delay over loopback is this machine's scheduling, not a fabric's: the threshold is the
        # timeout, so delay is not judged here (the rail lab's slow-host case judges it).
        rtt_threshold_us=3_000_000.0,
        # An 8 s window read every second (the test's agents report every 0.5 s): the localiser
        # leaves out a node's results for one window after it connects, so with the default 30 s
        # window the clean stretch judged nothing and the fault was only seen ~35 s after the
        # agents connected, against this test's 40 s bound: under load it missed it.
        localise_window_s=8.0,
        localise_every_s=1.0,
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
        ),
        clock=SYSTEM_CLOCK,
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
        assert plan.listen["node-000/nic-1"] == f"127.{_OCTET}.101.10" and plan.dscp == 26
        await wait_for(
            lambda: (
                ctl.core.detection.probes is not None
                and ctl.core.detection.probes.sums is not None
                and len(ctl.core.detection.probes.sums) > 30
            ),
            timeout=30,
            what="probe results reaching the controller",
        )
        await wait_for(lambda: sum(a.agent.prober.answered_total for a in agents) > 500, what="probes answered")
        # a clean stretch the localiser judged: every node's results count, and a full window of them
        window_ms = int(probes.localise_window_s * 1000)
        await wait_for(
            lambda: all(ctl.core.detection._probe_node_ok(n, ctl.clock.time_ms() - window_ms) for n in fabric.nodes()),
            timeout=30,
            what="every node's probe results counting",
        )
        await asyncio.sleep(probes.localise_window_s)
        assert ctl.core.open_incidents() == [], _evidence(ctl)

        data_plane.inject_loss("leaf-b1-r0", 0.05)
        await wait_for(lambda: bool(ctl.core.open_incidents()), timeout=40, what="an incident")
        incidents = ctl.core.open_incidents()
        assert [(i.kind, i.root_cause) for i in incidents] == [("switch_fault", "leaf-b1-r0")], _evidence(ctl)
        assert incidents[0].affected_nodes == []  # no node is blamed, none is evicted
    finally:
        await halt_agents(agents)
        await ctl.stop()
