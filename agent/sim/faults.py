"""The simulator's one fault table: every fault a simulated cluster can suffer, written once.

The scenario format checks faults against ``FAULTS``, ``SimNode`` and the scenario
cluster inject and clear through it, and the demo draws its faults from it. A new fault
kind is one entry here (plus the fake's surface, if it needs a new one); a GPU fault
that sets fake NVML values is ``_gpu_kind(name, doc, inject, params=...)``: its clear
puts the GPU back as it was built. What an entry holds is ``agent.sim.fault_kinds``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from agent.sim.fake_amdsmi import MI300X_XGMI_LINKS, FakeAmdSmi
from agent.sim.fake_kmsg import KERN_ERR
from agent.sim.fake_npu_smi import FakeNpuSmi
from agent.sim.fake_nvml import H100_NVLINKS, H100_PCIE_GEN, H100_PCIE_WIDTH
from agent.sim.fault_kinds import (
    ClusterAction,
    ClusterSurface,
    Fault,
    FaultKind,
    FaultTable,
    NodeAction,
    OnCluster,
    OnNode,
    Param,
    Params,
    UnknownFault,
    part_index,
)
from agent.sim.probe_fabric import component as probe_component

if TYPE_CHECKING:
    from agent.sim.parts import SimParts


# -- node actions: one part of one simulated node (its SimParts) --------------------------------


def _gpu_healthy(sim: SimParts, i: int, p: Params) -> None:
    """Every GPU fault's clear: the GPU is back as it was built (NVML's view of it; the log stays)."""
    sim.nvml.clear(i)


def _gpu_xid(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.inject_xid(i, p["xid"])
    sim.kmsg.xid(sim.gpu_kmsg_pci(i), p["xid"], "injected by the simulator")


def _gpu_ecc_dbe(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.inject_ecc_dbe(i)
    sim.kmsg.xid(sim.gpu_kmsg_pci(i), 48, "An uncorrectable double bit error (DBE) has been detected")


def _gpu_lost(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.inject_gpu_lost(i)
    sim.kmsg.fallen_off_bus(sim.nvml.gpu(i).pci_bus_id.lower()[4:], with_xid=True)


def _gpu_row_remap_failure(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.inject_row_remap_failure(i)
    sim.kmsg.xid(sim.gpu_kmsg_pci(i), 64, "Row remapping failure")


def _gpu_nvlink_down(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.inject_nvlink_down(i, p["link"])


def _amd(sim: SimParts) -> FakeAmdSmi:
    if sim.amdsmi is None:
        raise UnknownFault(f"{sim.node_id} has {sim.vendor} GPUs, not AMD ones")
    return sim.amdsmi


def _npu_smi(sim: SimParts) -> FakeNpuSmi:
    if sim.npu_smi is None:
        raise UnknownFault(f"{sim.node_id} has {sim.vendor} accelerators, not Ascend NPUs")
    return sim.npu_smi


def _amd_ras_uncorrectable(sim: SimParts, i: int, p: Params) -> None:
    smi = _amd(sim)
    smi.inject_ecc(i, smi.AmdSmiGpuBlock.UMC, uncorrectable=int(p["count"]))
    sim.kmsg.line(
        f"amdgpu {smi.gpus[i].bdf}: amdgpu: {int(p['count'])} uncorrectable hardware errors detected in umc block",
        KERN_ERR,
    )


def _amd_xgmi_down(sim: SimParts, i: int, p: Params) -> None:
    _amd(sim).set_xgmi_link(i, int(p["link"]), up=False)


def _amd_healthy(sim: SimParts, i: int, p: Params) -> None:
    _amd(sim).clear(i)


def _ascend_fault(sim: SimParts, i: int, p: Params) -> None:
    _npu_smi(sim).inject(i, f"{int(p['code']):08X}", health="Alarm")


def _ascend_healthy(sim: SimParts, i: int, p: Params) -> None:
    _npu_smi(sim).clear(i)


def _gpu_thermal_slowdown(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.inject_thermal_slowdown(i)


def _gpu_pcie_degraded(sim: SimParts, i: int, p: Params) -> None:
    width, gen = p.get("width"), p.get("gen")
    if width is None and gen is None:
        width = H100_PCIE_WIDTH // 2  # neither given: half the lanes, the commonest way a link degrades
    sim.nvml.set_pcie_link(i, width, gen)


def _gpu_slow(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.set_slow(i, p["factor"])
    sim.scale_throughput(p["factor"])  # the whole node's collective traffic waits for its slowest GPU


def _gpu_slow_clear(sim: SimParts, i: int, p: Params) -> None:
    sim.nvml.clear(i)
    sim.restore_throughput()


def _nic_down(sim: SimParts, i: int, p: Params) -> None:
    sim.port_down(i)


def _nic_up(sim: SimParts, i: int, p: Params) -> None:
    sim.port_up(i)


def _one_shot(sim: SimParts, i: int, p: Params) -> None:
    """The clear of a fault that happened and is over (flaps, an error burst): nothing is left to undo."""


def _nic_flap(sim: SimParts, i: int, p: Params) -> None:
    sim.sysfs.flap(i, p["count"])


def _nic_errors(sim: SimParts, i: int, p: Params) -> None:
    sim.sysfs.error_burst(i, p["n"])


def _nic_degraded(sim: SimParts, i: int, p: Params) -> None:
    sim.degrade(i, p["rate_gbps"])


def _nic_degraded_clear(sim: SimParts, i: int, p: Params) -> None:
    sim.undegrade(i, p["rate_gbps"])


def _nic_storm(sim: SimParts, i: int, p: Params) -> None:
    sim.sysfs.pfc_storm(i, True)


def _nic_storm_clear(sim: SimParts, i: int, p: Params) -> None:
    sim.sysfs.pfc_storm(i, False)


# -- cluster actions: the fabric ------------------------------------------------------------


def _cut(c: ClusterSurface, f: Fault) -> None:
    c.cut_cables(f.target)


def _mend(c: ClusterSurface, f: Fault) -> None:
    c.mend_cables(f.target)


def _switch_down(c: ClusterSurface, f: Fault) -> None:
    """A dead switch goes silent and its peers see their ends go down; its own tables say nothing."""
    c.cut_cables(f.target)
    c.silence(f.target)


def _switch_up(c: ClusterSurface, f: Fault) -> None:
    c.mend_cables(f.target)
    c.unsilence(f.target)


def _pfc_storm(c: ClusterSurface, f: Fault) -> None:
    if c.shape(f.target) == "port":
        switch, port = c.switch_port(f.target)
        if c.hold(("storm", switch, port)):
            with c.switch(switch) as fake:
                fake.pfc_storm(port, True, queue=f.params.get("queue"))
    elif c.hold(("storm", f.target)):
        _nic_storm(c.node(f.target), part_index(f.target, "nic"), f.params)


def _pfc_storm_clear(c: ClusterSurface, f: Fault) -> None:
    if c.shape(f.target) == "port":
        switch, port = c.switch_port(f.target)
        if c.release(("storm", switch, port)):
            with c.switch(switch) as fake:
                fake.pfc_storm(port, False)
    elif c.release(("storm", f.target)):
        _nic_storm_clear(c.node(f.target), part_index(f.target, "nic"), f.params)


def _optics(on: bool) -> ClusterAction:
    def act(c: ClusterSurface, f: Fault) -> None:
        switch, port = c.switch_port(f.target)
        if c.hold(("optics", switch, port)) if on else c.release(("optics", switch, port)):
            with c.switch(switch) as fake:
                fake.optics_degraded(port, on)

    return act


def _node_down(c: ClusterSurface, f: Fault) -> None:
    c.halt(f.target)


def _node_up(c: ClusterSurface, f: Fault) -> None:
    c.revive(f.target)


def _partition(c: ClusterSurface, f: Fault) -> None:
    for name in f.targets:
        c.silence(name)


def _partition_clear(c: ClusterSurface, f: Fault) -> None:
    for name in f.targets:
        c.unsilence(name)


def _collective_stall(c: ClusterSurface, f: Fault) -> None:
    """A job stuck in a collective on every target node: its ranks on every GPU, the GPUs busy at
    idle power, the NICs silent. No job library: only the hardware and the scheduler's cgroups say so."""
    for name in f.targets:
        if c.hold(("collective_stall", name)):
            sim = c.node(name)
            sim.run_job(str(f.params["job"]))
            sim.collective_stall(True)


def _collective_stall_clear(c: ClusterSurface, f: Fault) -> None:
    for name in f.targets:
        if c.release(("collective_stall", name)):
            sim = c.node(name)
            sim.collective_stall(False)
            sim.run_job(None)


# -- cluster actions: the data plane the probe mesh crosses ----------------------------------


def _probe_fault(what: str, param: str, scale: float) -> tuple[ClusterAction, ClusterAction]:
    """Inject and clear of a fault the data plane alone shows: ``what`` ("loss" or "delay") of the
    fault's ``param`` (times ``scale``) on the target's component. Counters and port states stay as
    they were: only probes crossing the component are dropped or slowed. The first fault holding a
    component's loss (or delay) sets it, the last one releasing it takes it away."""

    def inject(c: ClusterSurface, f: Fault) -> None:
        comp = probe_component(f.target)
        if c.hold(("probe", what, comp)):
            plane = c.data_plane()
            value = float(f.params[param]) * scale
            (plane.inject_loss if what == "loss" else plane.inject_delay)(comp, value)

    def clear(c: ClusterSurface, f: Fault) -> None:
        comp = probe_component(f.target)
        if c.release(("probe", what, comp)):
            plane = c.data_plane()
            (plane.clear_loss if what == "loss" else plane.clear_delay)(comp)

    return inject, clear


def _loss_param(doc: str) -> Param:
    return Param("loss", doc, integer=False, default=0.01, exclusive_minimum=True, maximum=0.5)


def _delay_param(doc: str) -> Param:
    return Param("delay_ms", doc, integer=False, default=1.0, exclusive_minimum=True, maximum=400.0)


# -- the table --------------------------------------------------------------------------------

_GPU = frozenset({"gpu"})
_NIC = frozenset({"nic"})
_GPU_INCIDENTS = ("gpu_fault", "node_fault")
_NIC_INCIDENTS = ("nic_fault", "link_fault")


def _gpu_kind(name: str, doc: str, inject: NodeAction, *, demo: tuple[Params, ...] = (), **kw: Any) -> FaultKind:
    return FaultKind(name, doc, _GPU, _GPU_INCIDENTS, node=OnNode("gpu", inject, _gpu_healthy), demo=demo, **kw)


_VENDOR_CLEAR = {"amd": _amd_healthy, "ascend": _ascend_healthy}


def _vendor_gpu_kind(name: str, doc: str, vendor: str, inject: NodeAction, *params: Param) -> FaultKind:
    """A fault of one vendor's GPUs (refused on others'); its clear puts the GPU back as it was built."""
    node = OnNode("gpu", inject, _VENDOR_CLEAR[vendor])
    return FaultKind(name, doc, _GPU, _GPU_INCIDENTS, params=params, node=node, vendor=vendor)


FAULTS: Final[FaultTable] = FaultTable(
    [
        _gpu_kind(
            "gpu_xid",
            "An Xid critical-error event from NVML and its NVRM line in the kernel log.",
            _gpu_xid,
            params=(
                Param("xid", "the Xid number (79: fallen off the bus, 48: DBE, 13: graphics engine...)", minimum=1),
            ),
            demo=({"xid": 79}, {"xid": 95}, {"xid": 13}),
        ),
        _gpu_kind(
            "gpu_ecc_dbe",
            "An uncorrectable ECC error: counters, a DBE event, a row remap pending, Xid 48 in the log.",
            _gpu_ecc_dbe,
            demo=({},),
        ),
        _gpu_kind(
            "gpu_lost",
            "The GPU fell off the bus: Xid 79, then every NVML call for it fails.",
            _gpu_lost,
        ),
        _gpu_kind(
            "gpu_row_remap_failure",
            "Row remapping failed (no spare rows left): the GPU needs replacing; Xid 64 in the log.",
            _gpu_row_remap_failure,
            demo=({},),
        ),
        _gpu_kind(
            "gpu_nvlink_down",
            "One NVLink of the GPU goes down after a recovery attempt.",
            _gpu_nvlink_down,
            params=(Param("link", "which NVLink", default=0, maximum=H100_NVLINKS - 1),),
            demo=({"link": 3},),
        ),
        _vendor_gpu_kind(
            "amd_ras_uncorrectable",
            "AMD: uncorrectable errors in the UMC (HBM) RAS block, and the amdgpu line saying so.",
            "amd",
            _amd_ras_uncorrectable,
            Param("count", "new uncorrectable errors", default=1, minimum=1),
        ),
        _vendor_gpu_kind(
            "amd_xgmi_down",
            "AMD: one XGMI link of the GPU goes down.",
            "amd",
            _amd_xgmi_down,
            Param("link", "which XGMI link", default=0, maximum=MI300X_XGMI_LINKS - 1),
        ),
        _vendor_gpu_kind(
            "ascend_fault",
            "Ascend: the NPU's health turns Alarm with a DCMI fault code (npu-smi info -t health lists it).",
            "ascend",
            _ascend_fault,
            Param("code", "the DCMI fault code (write it in hex: 0x80E18005)", default=0x80E18005),
        ),
        _gpu_kind(
            "gpu_thermal_slowdown",
            "Hardware thermal slowdown: the clock-event reasons say so and the SM clock drops.",
            _gpu_thermal_slowdown,
            demo=({},),
        ),
        _gpu_kind(
            "gpu_pcie_degraded",
            "The GPU's PCIe link trained narrower (lanes lost) and/or below its maximum generation"
            " (neither given: x8, half its lanes).",
            _gpu_pcie_degraded,
            params=(
                Param(
                    "width", "the lanes it runs on (absent: as built)", default=None, minimum=1, maximum=H100_PCIE_WIDTH
                ),
                Param(
                    "gen",
                    "the generation it runs at (absent: as built)",
                    default=None,
                    minimum=1,
                    maximum=H100_PCIE_GEN,
                ),
            ),
        ),
        FaultKind(
            "gpu_slow",
            "A fail-slow straggler: the GPU's clock, power and utilisation, and the node's traffic, scaled down.",
            _GPU,
            ("straggler",),
            params=(
                Param(
                    "factor",
                    "what is left of its speed",
                    integer=False,
                    default=0.7,
                    exclusive_minimum=True,
                    maximum=1,
                ),
            ),
            node=OnNode("gpu", _gpu_slow, _gpu_slow_clear),
            answered_by_effect=True,
        ),
        FaultKind(
            "nic_down",
            "The NIC's port goes down, and with it the switch port at the cable's other end.",
            _NIC,
            _NIC_INCIDENTS,
            node=OnNode("nic", _nic_down, _nic_up),
            cluster=OnCluster(_cut, _mend),
            demo=({},),
        ),
        FaultKind(
            "nic_flap",
            "The port went down and retrained ``count`` times (one-shot: it ends up).",
            _NIC,
            _NIC_INCIDENTS,
            params=(Param("count", "how many flaps", default=3, minimum=1),),
            node=OnNode("nic", _nic_flap, _one_shot),
            demo=({"count": 3},),
        ),
        FaultKind(
            "nic_errors",
            "A burst of physical-layer errors and the transport loss they cause (one-shot).",
            _NIC,
            _NIC_INCIDENTS,
            params=(
                Param("n", "symbol errors in the burst (the other counters follow from it)", default=1000, minimum=1),
            ),
            node=OnNode("nic", _nic_errors, _one_shot),
        ),
        FaultKind(
            "nic_degraded",
            "The port negotiated a lower rate (a lane down, a bad cable).",
            _NIC,
            _NIC_INCIDENTS,
            params=(
                Param("rate_gbps", "the rate it runs at, Gb/s", integer=False, default=200.0, exclusive_minimum=True),
            ),
            node=OnNode("nic", _nic_degraded, _nic_degraded_clear),
        ),
        FaultKind(
            "switch_down",
            "A dead switch: its agent goes silent and every cable's far end goes down.",
            frozenset({"switch"}),
            ("switch_fault",),
            cluster=OnCluster(_switch_down, _switch_up),
        ),
        FaultKind(
            "switch_port_down",
            "A switch port's link drops (a cable pulled, an optic dead): down at both ends.",
            frozenset({"port", "link"}),
            ("link_fault", "switch_fault", "nic_fault"),
            cluster=OnCluster(_cut, _mend),
        ),
        FaultKind(
            "pfc_storm",
            "Pause frames as fast as a NIC can send them, or a switch port's PFC watchdog seeing a storm.",
            frozenset({"nic", "port"}),
            ("nic_fault", "link_fault", "switch_fault"),
            params=(
                Param(
                    "queue",
                    "the lossless queue in storm (default: the first)",
                    default=None,
                    shapes=frozenset({"port"}),
                ),
            ),
            node=OnNode("nic", _nic_storm, _nic_storm_clear),
            cluster=OnCluster(_pfc_storm, _pfc_storm_clear),
        ),
        FaultKind(
            "optics_degraded",
            "The switch port's receive power falls below the low alarm (on a NIC: its switch port).",
            frozenset({"nic", "port"}),
            ("link_fault", "switch_fault"),
            cluster=OnCluster(_optics(True), _optics(False)),
        ),
        FaultKind(
            "node_down",
            "The machine dies: its agent stops; on clear a fresh agent starts on the same buffer.",
            frozenset({"node"}),
            ("node_down",),
            cluster=OnCluster(_node_down, _node_up),
        ),
        FaultKind(
            "collective_stall",
            "A job hung in a collective on the target nodes: its GPUs busy at idle power, their NICs flat"
            " (its ranks are the GPUs' compute processes, in Slurm job ``job``'s cgroup).",
            frozenset({"node"}),
            ("job_hang",),
            params=(Param("job", "the Slurm job id of the ranks", default=4242, minimum=1),),
            cluster=OnCluster(_collective_stall, _collective_stall_clear),
            many=True,
        ),
        FaultKind(
            "switch_silent_drop",
            "A switch drops a share of what crosses it without counting it: its counters and ports look"
            " clean, only probes through it are lost (seen by the probe mesh alone).",
            frozenset({"switch"}),
            ("switch_fault",),
            params=(_loss_param("share of packets lost at each crossing (0.01: 1 %)"),),
            cluster=OnCluster(*_probe_fault("loss", "loss", 1.0)),
            probed=True,
        ),
        FaultKind(
            "link_loss",
            "A cable loses a share of its packets without an error counted (a leaf-spine cable: the flows"
            " ECMP puts on it; a NIC's cable: that NIC's probes); seen by the probe mesh alone.",
            frozenset({"link"}),
            ("link_fault", "nic_fault"),
            params=(_loss_param("share of packets lost at each crossing (0.01: 1 %)"),),
            cluster=OnCluster(*_probe_fault("loss", "loss", 1.0)),
            probed=True,
        ),
        FaultKind(
            "link_delay",
            "A cable adds delay to every round trip over it (a leaf-spine cable: the flows ECMP puts on it);"
            " seen by the probe mesh alone.",
            frozenset({"link"}),
            ("link_fault", "nic_fault"),
            params=(_delay_param("round-trip milliseconds added"),),
            cluster=OnCluster(*_probe_fault("delay", "delay_ms", 1e-3)),
            probed=True,
        ),
        FaultKind(
            "host_net_delay",
            "The host is slow to move packets (a busy CPU, a stuck softirq): every probe to or from it comes"
            " back late, whatever path it took; a host fault, not the network's.",
            frozenset({"node"}),
            ("host_fault",),
            params=(_delay_param("round-trip milliseconds added to every probe it sends or answers"),),
            cluster=OnCluster(*_probe_fault("delay", "delay_ms", 1e-3)),
            probed=True,
        ),
        FaultKind(
            "nic_cable_loss",
            "The NIC's cable (or transceiver) loses a share of its packets with no error counted: that NIC's"
            " probes are lost, every other NIC under its leaf is clean.",
            frozenset({"nic"}),
            ("nic_fault",),
            params=(_loss_param("share of packets lost at each crossing (0.01: 1 %)"),),
            cluster=OnCluster(*_probe_fault("loss", "loss", 1.0)),
            probed=True,
        ),
        FaultKind(
            "partition",
            "The targets (nodes or switches) lose the controller while they keep running.",
            frozenset({"node", "switch"}),
            ("partition",),
            cluster=OnCluster(_partition, _partition_clear),
            many=True,
        ),
    ]
)
