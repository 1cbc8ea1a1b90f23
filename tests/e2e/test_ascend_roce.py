"""The Ascend NPUs' own RoCE ports end to end: fake npu-smi and hccn_tool on PATH -> a real agent
process on the ``ascend`` backend -> a real controller, which places each NPU port on the fabric
from its LLDP peer and judges it with the NIC rules (a port link down -> a NIC incident)."""

from __future__ import annotations

from pathlib import Path

import pytest

from controller.fabric import generate_fabric
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from tests.ascend_tools import AscendTools
from tests.e2e.agent_process import agent_process
from tests.helpers import wait_for

pytestmark = pytest.mark.slow


async def test_npu_ports_on_the_fabric_and_judged_as_nics(tmp_path: Path) -> None:
    fabric = generate_fabric(4, 8, 8, 2, 1)  # node-001 in block 0: its NIC i on leaf-b0-r<i>, one port on each
    ctl = Controller(
        ControllerConfig(
            listen="127.0.0.1:0", http="127.0.0.1:0", db_path=tmp_path / "c.db", fabric=fabric, sweep_interval_s=0.2
        ),
        clock=SYSTEM_CLOCK,
    )
    ctl.detection.correlator.config.settle_s = 0.5
    ctl.detection.topology.min_interval_s = 0.0
    await ctl.start()
    slot = fabric.port_of("node-001/nic-0")
    assert slot is not None and {fabric.port_of(f"node-001/nic-{d}") for d in range(8)} == {slot}
    tools = AscendTools(tmp_path / "ascend", npus=8, slot_port=slot)
    tools.set_peer(2, "leaf-b1-r2", slot)  # NPU 2's cable ends on the other block's rail-2 leaf
    try:
        async with agent_process(ctl, tmp_path, "ascend", tools.env(), "the Ascend node registered with a report"):
            await _placed_and_judged(ctl, tools)
    finally:
        await ctl.stop()


async def _placed_and_judged(ctl: Controller, tools: AscendTools) -> None:
    """LLDP peers place the ports (NPU 2's miswire learned, the others confirmed); a port down is a NIC incident."""
    fabric = ctl.detection.topology.fabric
    assert fabric is not None
    inv = ctl.registry.nodes["node-001"].inventory
    assert [(n.rdma_device, n.owner) for n in inv.nics] == [(f"npu{d}", "ascend-npu") for d in range(8)]
    assert {(g.vendor, g.interconnect, g.link_count) for g in inv.gpus} == {("ascend", "hccs", 7)}
    assert len([n for n in ctl.registry.nodes["node-001"].lldp if n.local_interface.startswith("npu")]) == 8

    def placed() -> bool:
        ctl.detection.topology.tick()
        return fabric.leaf_of("node-001/nic-2") == "leaf-b1-r2"

    await wait_for(placed, 30, "NPU 2's port placed on the leaf its LLDP peer names")
    report = ctl.detection.topology.report
    assert [m.component for m in report.miswired] == ["node-001/nic-2"]
    assert not report.missing and not report.unresolved  # the seven others confirmed by their LLDP peer
    assert [fabric.leaf_of(f"node-001/nic-{d}") for d in (0, 1, 3, 7)] == [f"leaf-b0-r{d}" for d in (0, 1, 3, 7)]
    assert not ctl.detection.incidents.list_incidents(active_only=True)

    tools.set_link(4, False)
    await wait_for(lambda: bool(ctl.detection.incidents.list_incidents(active_only=True)), 30, "the NIC incident")
    (incident,) = ctl.detection.incidents.list_incidents(active_only=True)
    assert incident.kind == "nic_fault" and "node-001/nic-4" in incident.root_cause, incident
