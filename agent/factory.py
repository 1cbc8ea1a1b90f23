"""The agent's explicit collector registry: which collectors run, on what hardware surface.

`nvml` reads the real driver and /sys; `sim` points the same collector classes at a
simulated node (fake NVML, fake sysfs tree, fake kernel log). Never a silent fallback:
asking for `nvml` where there is no driver is an error the operator sees.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.collectors.base import Collector, FindingSink
from agent.collectors.ethtool import EthtoolCollector
from agent.collectors.gpu import NvmlGpuCollector, nvml_unavailable_reason
from agent.collectors.host import HostCollector
from agent.collectors.kmsg import KmsgCollector
from agent.collectors.lldp import LldpCollector
from agent.collectors.rdma import RdmaSysfsCollector
from agent.sim.node import SimNode

BACKENDS = ("nvml", "sim")


class BackendUnavailable(RuntimeError):
    """The requested hardware backend cannot run here; the message is one line for the operator."""


@dataclass
class CollectorPlan:
    collectors: list[Collector]
    starters: list[Callable[[], object]] = field(default_factory=list)
    before_collect: Callable[[float], None] | None = None


def load_nvml() -> Any:
    """The real pynvml module, initialised; BackendUnavailable with one clear line otherwise."""
    import pynvml

    reason = nvml_unavailable_reason(pynvml)
    if reason is not None:
        raise BackendUnavailable(reason)
    return pynvml


def build_collectors(
    backend: str,
    sink: FindingSink | None,
    *,
    sysfs_root: str = "/sys",
    kmsg_path: str | None = "/dev/kmsg",
    mounts: Sequence[str] = ("/",),
    sim: SimNode | None = None,
    lldp: bool = True,
    ethtool: bool = True,
    kmsg_from_start: bool = False,
) -> CollectorPlan:
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} is not one of {BACKENDS}")
    ethtool_dir: str | None = None
    if backend == "nvml":
        nvml = load_nvml()
    else:
        if sim is None:
            raise ValueError("the sim backend needs a SimNode")
        nvml = sim.nvml
        sysfs_root = sim.sysfs_root
        kmsg_path = sim.kmsg_path
        ethtool_dir = sim.sysfs.ethtool_dir
        lldp = False  # simulated nodes have no lldpd; the scenario runner feeds LLDP itself
    gpu = NvmlGpuCollector(nvml, sink)
    collectors: list[Collector] = [gpu, RdmaSysfsCollector(sysfs_root)]
    starters: list[Callable[[], object]] = [gpu.start_events]
    if ethtool:
        collectors.append(EthtoolCollector(stats_dir=ethtool_dir))
    collectors.append(HostCollector(mounts=mounts))
    if kmsg_path:
        kmsg = KmsgCollector(kmsg_path, sink, from_start=kmsg_from_start)
        collectors.append(kmsg)
        starters.append(kmsg.start)
    if lldp:
        collectors.append(LldpCollector())
    return CollectorPlan(
        collectors=collectors,
        starters=starters,
        before_collect=sim.advance if sim is not None else None,
    )
