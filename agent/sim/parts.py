"""One simulated GPU server's parts: fake NVML (or AMD SMI, npu-smi), fake sysfs and a fake kernel log.

``vendor`` says whose accelerators it has: NVIDIA (fake NVML), AMD (``amdsmi``: fake AMD SMI)
or Ascend (``npu_smi``: a fake npu-smi). The fault table's node actions (``agent.sim.faults``)
act on these parts; ``agent.sim.node.SimNode`` adds injection by the table's kinds. Kept apart
from it so that the table and the node do not import each other.
"""

from __future__ import annotations

import threading
from pathlib import Path

from agent.sim.fake_amdsmi import FakeAmdSmi
from agent.sim.fake_kmsg import FakeKmsg
from agent.sim.fake_npu_smi import FakeNpuSmi
from agent.sim.fake_nvml import FakeNvml
from agent.sim.fake_sysfs import FakeSysfs
from agent.sim.real_netdev import RealNetdevs

SIM_VENDORS = ("nvidia", "amd", "ascend")


def kmsg_pci(nvml_bus_id: str) -> str:
    """NVML '00000000:9B:00.0' -> the driver's Xid form '0000:9b:00'."""
    domain, bus, devfn = nvml_bus_id.lower().split(":")
    return f"{domain[-4:]}:{bus}:{devfn.split('.')[0]}"


class SimParts:
    """The surfaces of one simulated node that collectors read and fault actions change."""

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
        vendor: str = "nvidia",
        npu_layout: str = "910B",
    ) -> None:
        if vendor not in SIM_VENDORS:
            raise ValueError(f"sim vendor {vendor!r} is not one of {SIM_VENDORS}")
        self.node_id = node_id
        self.vendor = vendor
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.sysfs = FakeSysfs(
            str(self.workdir / "sys"), nics=nics, rail_link_layer=link_layer, rate_gbps=rate_gbps, seed=seed
        )
        self.nvml = FakeNvml(gpu_count=gpus, seed=seed, pci_buses=self._gpu_buses(gpus))
        self.amdsmi = FakeAmdSmi(gpu_count=gpus, pci_buses=self._gpu_buses(gpus)) if vendor == "amd" else None
        self.npu_smi = (
            FakeNpuSmi(npu_count=gpus, pci_buses=self._gpu_buses(gpus), layout=npu_layout)
            if vendor == "ascend"
            else None
        )
        self.kmsg = FakeKmsg(str(self.workdir / "kmsg"))
        self.gpus = gpus
        self.nics = nics
        self.base_throughput_gbps = throughput_gbps
        self._throughput = [throughput_gbps] * nics
        self._degraded: dict[int, list[float]] = {}  # NIC -> rates of the degradations held, oldest first
        self._lock = threading.Lock()
        self.real_netdevs: RealNetdevs | None = None
        self._net_lock = threading.Lock()  # real_netdevs.sync: the cycle and the link watch

    def process_source(self) -> tuple[FakeNvml, str] | None:
        """The fake NVML and the fake proc root its GPU processes are read from (NVIDIA nodes)."""
        return (self.nvml, str(self.workdir / "proc")) if self.vendor == "nvidia" else None

    def run_job(self, job: str | None, pid_base: int = 40_000) -> None:
        """A Slurm job's ranks on every GPU (one process each, its cgroup naming ``job_<id>``); None: none."""
        for i in range(self.gpus):
            pid = pid_base + i
            folder = self.workdir / "proc" / str(pid)
            if job is None:
                for f in ("cgroup", "environ"):
                    (folder / f).unlink(missing_ok=True)
                self.nvml.set_processes(i, [])
                continue
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "cgroup").write_text(f"0::/system.slice/slurmstepd.scope/job_{job}/step_0/user/task_{i}\n")
            (folder / "environ").write_bytes(f"SLURM_JOB_ID={job}\0SLURM_PROCID={i}\0".encode())
            self.nvml.set_processes(i, [(pid, 60 * 1024**3)])

    def collective_stall(self, on: bool) -> None:
        """Every GPU spins in a stuck collective (busy at idle power) and the NICs carry nothing."""
        for i in range(self.gpus):
            self.nvml.set_collective_stall(i, on)
        with self._lock:
            self._throughput = [0.0 if on else self.base_throughput_gbps] * self.nics

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

    def sync_real_netdevs(self) -> None:
        """The driver's part: RDMA ports follow their real netdevs now (before each collect, and
        when netlink says a netdev changed: the agent's link watch calls it from its thread)."""
        if self.real_netdevs is None:
            return
        with self._net_lock:
            changed = self.real_netdevs.sync()
        for i, up in changed.items():
            with self._lock:
                self._throughput[i] = self.base_throughput_gbps if up else 0.0

    def advance(self, dt_s: float) -> None:
        """Move counters forward by dt_s of simulated traffic (called before each collect)."""
        self.sync_real_netdevs()
        with self._lock:
            throughput = list(self._throughput)
        self.sysfs.advance(max(dt_s, 0.0), throughput_gbps=throughput)

    def gpu_kmsg_pci(self, index: int) -> str:
        """GPU ``index``'s PCI address as the driver writes it in Xid lines."""
        return kmsg_pci(self.nvml.gpu(index).pci_bus_id)

    def port_down(self, i: int) -> None:
        """NIC i's link is down: its port says so and it carries no traffic."""
        self.sysfs.set_port_down(i)
        with self._lock:
            self._throughput[i] = 0.0

    def port_up(self, i: int) -> None:
        """NIC i's link is up again at full traffic (a storm or a lower rate still held stays)."""
        self.sysfs.set_port_up(i)
        with self._lock:
            self._throughput[i] = self.base_throughput_gbps

    def degrade(self, i: int, rate_gbps: float) -> None:
        """NIC i runs at ``rate_gbps``; overlapping degradations stack, the latest one showing."""
        with self._lock:
            rates = self._degraded.setdefault(i, [])
            rates.append(float(rate_gbps))
        self.sysfs.degrade(i, rate_gbps)

    def undegrade(self, i: int, rate_gbps: float) -> None:
        """End one degradation of NIC i: the latest one still held shows, or the nominal rate."""
        with self._lock:
            rates = self._degraded.get(i, [])
            if float(rate_gbps) in rates:
                rates.remove(float(rate_gbps))
            rate = rates[-1] if rates else None
        if rate is None:
            self.sysfs.restore_rate(i)
        else:
            self.sysfs.degrade(i, rate)

    def scale_throughput(self, factor: float) -> None:
        """Every NIC's traffic scaled by ``factor`` (a straggling GPU holds the node's collectives back)."""
        with self._lock:
            self._throughput = [t * factor for t in self._throughput]

    def restore_throughput(self) -> None:
        """Every NIC back at the node's base traffic."""
        with self._lock:
            self._throughput = [self.base_throughput_gbps] * self.nics
