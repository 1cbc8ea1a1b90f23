"""One simulated GPU server (``SimParts``) with fault injection by the fault table's kinds.

The real collectors read its fakes through the same surfaces they read on hardware; the
demo, the scenario runner and the tests inject faults here by the fault table's kinds
(``agent.sim.faults``), addressed to a part of this node ("gpu-2", "nic-5"). The composition
root (the CLI, the demo, the scenario cluster) builds one and hands it to ``agent.factory``
as its simulated host: no production module imports this package.
"""

from __future__ import annotations

import structlog

from agent.collectors.accel.amd import AmdGpuCollector
from agent.collectors.accel.ascend import AscendNpuCollector
from agent.collectors.accel.base import AcceleratorBackend
from agent.collectors.base import FindingSink
from agent.collectors.gpu import NvmlGpuCollector
from agent.sim.fault_kinds import UnknownFault, part_index
from agent.sim.faults import FAULTS
from agent.sim.parts import SIM_VENDORS, SimParts, kmsg_pci

__all__ = ["SIM_VENDORS", "SimNode", "kmsg_pci"]

log = structlog.get_logger(__name__)


class SimNode(SimParts):
    """A simulated node: its parts, the accelerator backend on its vendor's fake, and fault injection."""

    @property
    def ethtool_dir(self) -> str:
        """Where its NICs' ``ethtool -S`` output is written (the ethtool collector reads it)."""
        return self.sysfs.ethtool_dir

    def accelerator(self, sink: FindingSink | None) -> AcceleratorBackend:
        """The real backend class of this node's vendor, on that vendor's fake."""
        if self.amdsmi is not None:
            return AmdGpuCollector(self.amdsmi, sink)
        if self.npu_smi is not None:
            return AscendNpuCollector(self.npu_smi, sink)
        return NvmlGpuCollector(self.nvml, sink)

    # -- faults: the kinds are in agent.sim.faults; these are the node's own surfaces for them ----

    def inject(self, kind: str, target: str, **params: object) -> None:
        """Start a fault on this node: a fault table kind that acts on one node, on a part ("gpu-2")."""
        self._act(kind, target, params, starting=True)

    def clear(self, kind: str, target: str, **params: object) -> None:
        """End a fault (a scenario's until_s); ``params`` as it was injected with."""
        self._act(kind, target, params, starting=False)

    def _act(self, kind: str, target: str, params: dict[str, object], starting: bool) -> None:
        fault, action = FAULTS.on_node(kind)
        index = part_index(target, action.part)
        if not 0 <= index < (self.gpus if action.part == "gpu" else self.nics):
            raise UnknownFault(f"{self.node_id} has no {action.part}-{index}")
        values = fault.check_params(params, action.part)
        log.info("sim_fault_inject" if starting else "sim_fault_clear", node=self.node_id, kind=kind, target=target)
        (action.inject if starting else action.clear)(self, index, values)
