"""The agent's explicit collector registry: which collectors run, on what hardware surface.

`nvml`, `amd`, `ascend` and installed plugins (``agent.collectors.accel.registry``) read
the real hardware and /sys; `sim` points the same collector classes at a simulated node
(fake NVML, fake sysfs tree, fake kernel log) that the caller builds and hands in. Never a
silent fallback: asking for a backend whose driver or library is not there is an error the
operator sees, in one line.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from agent.collectors.accel import registry
from agent.collectors.accel.base import AcceleratorBackend, BackendUnavailable
from agent.collectors.base import Collector, FindingSink
from agent.collectors.ethtool import EthtoolCollector
from agent.collectors.gpu_procs import GpuProcessCollector
from agent.collectors.host import HostCollector
from agent.collectors.kmsg import KmsgCollector
from agent.collectors.lldp import LldpCollector, Runner, lldpcli_command
from agent.collectors.pci import pair_nics_with_gpus
from agent.collectors.rdma import RdmaSysfsCollector
from agent.collectors.sonic import SonicSwitchCollector, default_redis_factory
from agent.probe.prober import Prober
from agent.runtime import Agent, AgentConfig
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb

__all__ = [
    "BACKENDS",
    "BackendUnavailable",
    "CollectorPlan",
    "SimulatedHost",
    "build_agent",
    "build_collectors",
    "load_nvml",
]

BACKENDS = registry.backend_names()
load_nvml = registry.load_nvml


@dataclass
class CollectorPlan:
    collectors: list[Collector]
    starters: list[Callable[[], object]] = field(default_factory=list)
    before_collect: Callable[[float], None] | None = None
    kmsg: KmsgCollector | None = None
    inventory_hooks: list[Callable[[ipb.Inventory], None]] = field(default_factory=list)


def nic_gpu_pairing(sysfs_root: str) -> Callable[[ipb.Inventory], None]:
    """An inventory hook that fills each NIC's paired GPU from the PCIe topology.

    On a rail-optimised host GPU i and NIC i share a PCIe switch; the controller uses the
    pairing to name NICs by rail when LLDP is not available.
    """

    def pair(inventory: ipb.Inventory) -> None:
        nic_pci = {f"{n.rdma_device}/{n.port}": n.pci_address for n in inventory.nics if n.pci_address}
        gpu_pci = {g.index: g.pci_bus_id for g in inventory.gpus if g.pci_bus_id}
        pairs = pair_nics_with_gpus(sysfs_root, nic_pci, gpu_pci)
        for nic in inventory.nics:
            index = pairs.get(f"{nic.rdma_device}/{nic.port}")
            if index is not None:
                nic.paired_gpu_index = index

    return pair


class SimulatedHost(Protocol):
    """What the ``sim`` backend reads: a simulated node (``agent.sim.node.SimNode``).

    The composition root (the CLI, the demo, the scenario cluster) builds it and hands it in,
    so no production module imports the simulator.
    """

    @property
    def sysfs_root(self) -> str: ...
    @property
    def kmsg_path(self) -> str: ...
    @property
    def ethtool_dir(self) -> str: ...
    def accelerator(self, sink: FindingSink | None) -> AcceleratorBackend:
        """The real backend class of the node's vendor, on that vendor's fake."""
        ...

    def sync_real_netdevs(self) -> None: ...
    def advance(self, dt_s: float) -> None: ...
    def process_source(self) -> tuple[Any, str] | None:
        """(the NVML look-alike, the proc root) its GPU processes are read from; None: not NVIDIA."""
        ...


def build_collectors(
    backend: str,
    sink: FindingSink | None,
    *,
    sysfs_root: str = "/sys",
    kmsg_path: str | None = "/dev/kmsg",
    mounts: Sequence[str] = ("/",),
    sim: SimulatedHost | None = None,
    lldp: bool = True,
    ethtool: bool = True,
    kmsg_from_start: bool = False,
    lldpcli_socket: str | None = None,
    lldp_interval_s: float = 30.0,
    lldp_runner: Runner | None = None,
) -> CollectorPlan:
    """The collectors for one node, in the order they run (ethtool after nic: it reads its netdevs).

    ``lldp_runner`` answers the LLDP collector's lldpcli command in place of running it
    (the scenario cluster renders each node's neighbours from its fabric).
    """
    if backend not in registry.backend_names():
        raise ValueError(f"backend {backend!r} is not one of {registry.backend_names()}")
    ethtool_dir: str | None = None
    gpu: AcceleratorBackend
    if backend != registry.SIM:
        gpu = registry.build(backend, sink)
    else:
        if sim is None:
            raise ValueError("the sim backend needs a simulated host (agent.sim.node.SimNode)")
        sysfs_root = sim.sysfs_root
        kmsg_path = sim.kmsg_path if kmsg_path else None  # None: no kernel-log tail (one-shot scan)
        ethtool_dir = sim.ethtool_dir
        # A simulated node has no lldpd unless it is given one's socket (the netns harness runs
        # a real lldpd beside each simulated node) or a runner (the scenario cluster's fabric).
        lldp = lldp and (lldpcli_socket is not None or lldp_runner is not None)
        gpu = sim.accelerator(sink)
    rdma = RdmaSysfsCollector(sysfs_root)
    collectors: list[Collector] = [gpu, rdma]
    # Which process computes on which GPU, and its Slurm job (what hang detection without the
    # job library reads): NVML's process lists. AMD and Ascend backends do not say yet.
    procs = (load_nvml(), "/proc") if backend == "nvml" else sim.process_source() if sim is not None else None
    if procs is not None:
        collectors.append(GpuProcessCollector(*procs))
    starters: list[Callable[[], object]] = [gpu.start_events]
    if sink is not None:  # a port going down is an event at once, not news in the next report
        hook = sim.sync_real_netdevs if sim is not None else None
        starters.append(functools.partial(rdma.start_link_watch, sink, on_netdev_change=hook))
    if ethtool:
        collectors.append(EthtoolCollector(stats_dir=ethtool_dir))
    collectors.append(HostCollector(mounts=mounts))
    kmsg = None
    if kmsg_path:
        kmsg = KmsgCollector(kmsg_path, sink, from_start=kmsg_from_start)
        collectors.append(kmsg)
        starters.append(kmsg.start)
    host_lldp: LldpCollector | None = None
    if lldp:
        host_lldp = LldpCollector(lldpcli_command(lldpcli_socket), runner=lldp_runner, min_interval_s=lldp_interval_s)
        collectors.append(host_lldp)
    nic_ports = getattr(gpu, "nic_ports", None)  # an accelerator's own NIC ports (Ascend: hccn_tool)
    if nic_ports is not None:
        # After the host's LLDP collector: it keeps the report's neighbour list whole.
        nic_ports.host_neighbours = host_lldp.neighbors if host_lldp is not None else None
        collectors.append(nic_ports)
    return CollectorPlan(
        collectors=collectors,
        starters=starters,
        before_collect=sim.advance if sim is not None else None,
        kmsg=kmsg,
        inventory_hooks=[nic_gpu_pairing(sysfs_root)],
    )


def build_agent(config: AgentConfig, backend: str, prober: Prober | None = None, **factory_kwargs: Any) -> Agent:
    """An Agent whose collectors for `backend` push their findings into it.

    ``prober``: the probe mesh's prober (None: the real UDP one); a simulator hands one whose
    data plane is its fake fabric (agent.sim.probe_fabric).
    """
    holder: list[Agent] = []

    def sink(finding: Finding) -> None:
        holder[0].sink(finding)

    plan = build_collectors(backend, sink, **factory_kwargs)
    agent = Agent(
        config,
        plan.collectors,
        before_collect=plan.before_collect,
        starters=plan.starters,
        kmsg=plan.kmsg,
        inventory_hooks=plan.inventory_hooks,
        prober=prober,
    )
    holder.append(agent)
    return agent


def build_switch_agent(
    config: AgentConfig,
    redis_factory: Callable[[int], Any] | None = None,
    before_collect: Callable[[float], None] | None = None,
) -> Agent:
    """An agent on a SONiC switch: one collector reading the switch's own Redis databases.

    The node id is the switch's name in the fabric (e.g. "leaf-b0-r3"); the controller
    treats a silent switch agent as a switch condition, never as a dead compute node.
    ``before_collect`` runs before each cycle (a simulated switch moves its counters).
    """
    collector = SonicSwitchCollector(redis_factory or default_redis_factory, config.node_id)
    return Agent(config, [collector], before_collect=before_collect)
