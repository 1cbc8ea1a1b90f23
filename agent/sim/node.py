"""One simulated GPU server: fake NVML, fake sysfs and a fake kernel log, with fault injection.

The real collectors read these through the same surfaces they read on hardware; the
demo, the scenario runner and the tests inject faults here by the scenario format's
fault kinds, addressed to a component of this node ("gpu-2", "nic-5").
"""

from __future__ import annotations

import threading
from pathlib import Path

import structlog

from agent.sim.fake_kmsg import FakeKmsg
from agent.sim.fake_nvml import FakeNvml
from agent.sim.fake_sysfs import FakeSysfs
from agent.sim.real_netdev import RealNetdevs

log = structlog.get_logger(__name__)

GPU_FAULTS = {
    "gpu_xid",
    "gpu_ecc_dbe",
    "gpu_lost",
    "gpu_row_remap_failure",
    "gpu_nvlink_down",
    "gpu_thermal_slowdown",
    "gpu_slow",
}
NIC_FAULTS = {"nic_down", "nic_flap", "nic_errors", "nic_degraded", "pfc_storm"}
NODE_FAULTS = GPU_FAULTS | NIC_FAULTS


class UnknownFault(ValueError):
    pass


def _index(target: str, prefix: str) -> int:
    """'gpu-2' -> 2; also accepts 'node-003/gpu-2'."""
    leaf = target.rsplit("/", 1)[-1]
    if not leaf.startswith(prefix + "-") or not leaf[len(prefix) + 1 :].isdigit():
        raise UnknownFault(f"target {target!r} is not a {prefix} (expected '{prefix}-N')")
    return int(leaf[len(prefix) + 1 :])


def kmsg_pci(nvml_bus_id: str) -> str:
    """NVML '00000000:9B:00.0' -> the driver's Xid form '0000:9b:00'."""
    domain, bus, devfn = nvml_bus_id.lower().split(":")
    return f"{domain[-4:]}:{bus}:{devfn.split('.')[0]}"


class SimNode:
    def __init__(
        self,
        node_id: str,
        workdir: str | Path,
        gpus: int = 8,
        nics: int = 8,
        seed: int = 0,
        link_layer: str = "Ethernet",
        rate_gbps: float = 400.0,
        throughput_gbps: float = 180.0,
    ) -> None:
        self.node_id = node_id
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sysfs = FakeSysfs(
            str(self.workdir / "sys"), nics=nics, rail_link_layer=link_layer, rate_gbps=rate_gbps, seed=seed
        )
        self.nvml = FakeNvml(gpu_count=gpus, seed=seed, pci_buses=self._gpu_buses(gpus))
        self.kmsg = FakeKmsg(str(self.workdir / "kmsg"))
        self.gpus = gpus
        self.nics = nics
        self.base_throughput_gbps = throughput_gbps
        self._throughput = [throughput_gbps] * nics
        self._lock = threading.Lock()
        self.real_netdevs: RealNetdevs | None = None

    def follow_real_netdevs(self, net_root: str = "/sys/class/net") -> list[int]:
        """NICs whose netdev is a real interface here: their port state follows its carrier from now on."""
        self.real_netdevs = RealNetdevs(self.sysfs, net_root)
        self.real_netdevs.sync()
        return sorted(self.real_netdevs.linked)

    def _gpu_buses(self, gpus: int) -> list[int]:
        """Bus numbers that put GPU i beside NIC i, where the fake sysfs tree placed it."""
        buses = [int(addr.split(":")[1], 16) for addr in self.sysfs.gpu_pci_addresses()]
        return [buses[i] if i < len(buses) else 0xF0 + i for i in range(gpus)]

    @property
    def sysfs_root(self) -> str:
        return self.sysfs.root

    @property
    def kmsg_path(self) -> str:
        return self.kmsg.path

    def advance(self, dt_s: float) -> None:
        """Move counters forward by dt_s of simulated traffic (called before each collect)."""
        if self.real_netdevs is not None:
            for i, up in self.real_netdevs.sync().items():
                with self._lock:
                    self._throughput[i] = self.base_throughput_gbps if up else 0.0
        with self._lock:
            throughput = list(self._throughput)
        self.sysfs.advance(max(dt_s, 0.0), throughput_gbps=throughput)

    def _gpu_pci(self, index: int) -> str:
        return kmsg_pci(self.nvml.gpu(index).pci_bus_id)

    def inject(self, kind: str, target: str, **params: object) -> None:
        """Start a fault on this node. kind is a scenario fault kind; target a component."""
        log.info("sim_fault_inject", node=self.node_id, kind=kind, target=target, **params)
        if kind in GPU_FAULTS:
            self._inject_gpu(kind, _index(target, "gpu"), params)
        elif kind in NIC_FAULTS:
            self._inject_nic(kind, _index(target, "nic"), params)
        else:
            raise UnknownFault(f"fault kind {kind!r} is not a node fault ({sorted(NODE_FAULTS)})")

    def _inject_gpu(self, kind: str, i: int, params: dict[str, object]) -> None:
        if not 0 <= i < self.gpus:
            raise UnknownFault(f"{self.node_id} has no gpu-{i}")
        if kind == "gpu_xid":
            xid = int(str(params.get("xid", 79)))
            self.nvml.inject_xid(i, xid)
            self.kmsg.xid(self._gpu_pci(i), xid, "injected by the simulator")
        elif kind == "gpu_ecc_dbe":
            self.nvml.inject_ecc_dbe(i)
            self.kmsg.xid(self._gpu_pci(i), 48, "An uncorrectable double bit error (DBE) has been detected")
        elif kind == "gpu_lost":
            self.nvml.inject_gpu_lost(i)
            self.kmsg.fallen_off_bus(self.nvml.gpu(i).pci_bus_id.lower()[4:], with_xid=True)
        elif kind == "gpu_row_remap_failure":
            self.nvml.inject_row_remap_failure(i)
            self.kmsg.xid(self._gpu_pci(i), 64, "Row remapping failure")
        elif kind == "gpu_nvlink_down":
            self.nvml.inject_nvlink_down(i, int(str(params.get("link", 0))))
        elif kind == "gpu_thermal_slowdown":
            self.nvml.inject_thermal_slowdown(i)
        elif kind == "gpu_slow":
            factor = float(str(params.get("factor", 0.7)))
            self.nvml.set_slow(i, factor)
            with self._lock:
                self._throughput = [t * factor for t in self._throughput]

    def _inject_nic(self, kind: str, i: int, params: dict[str, object]) -> None:
        if not 0 <= i < self.nics:
            raise UnknownFault(f"{self.node_id} has no nic-{i}")
        if kind == "nic_down":
            self.sysfs.set_port_down(i)
            with self._lock:
                self._throughput[i] = 0.0
        elif kind == "nic_flap":
            self.sysfs.flap(i, int(str(params.get("count", 3))))
        elif kind == "nic_errors":
            self.sysfs.error_burst(i, int(str(params.get("n", 1000))))
        elif kind == "nic_degraded":
            self.sysfs.degrade(i, float(str(params.get("rate_gbps", 200.0))))
        elif kind == "pfc_storm":
            self.sysfs.pfc_storm(i, True)

    def clear(self, kind: str, target: str) -> None:
        """End a fault (a scenario's until_s)."""
        log.info("sim_fault_clear", node=self.node_id, kind=kind, target=target)
        if kind in GPU_FAULTS:
            i = _index(target, "gpu")
            self.nvml.clear(i)
            if kind == "gpu_slow":
                with self._lock:
                    self._throughput = [self.base_throughput_gbps] * self.nics
        elif kind in NIC_FAULTS:
            i = _index(target, "nic")
            self.sysfs.clear(i)
            with self._lock:
                self._throughput[i] = self.base_throughput_gbps
        else:
            raise UnknownFault(f"fault kind {kind!r} is not a node fault")
