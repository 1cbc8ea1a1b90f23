"""A fake sysfs tree of a multi-rail GPU node, with NIC fault injection.

The real RDMA, PCI-pairing and ethtool collectors run on it unchanged: it has the same
file names and formats as a recorded 8x400G H100 node (``counters/`` and
``hw_counters/`` per port, ``"4: ACTIVE"`` states, ``"400 Gb/sec (4X NDR)"`` rates),
real ``device`` symlinks into a PCIe hierarchy where GPU i and NIC i sit behind the
same switch, and ``ethtool -S`` text per netdev under ``<root>/ethtool/``.

Layout under ``root`` (rail i = 0..nics-1; the RoCE bond, when present, is NIC index ``nics``)::

    devices/pci0000:BB/0000:BB:01.0/0000:UU:00.0/0000:DD:0x.0/0000:EE:00.0   (endpoint)
        endpoint files: vendor, device, class, numa_node; NICs also net/<netdev>/{address,
        operstate,dev_port,statistics/*}
    devices/virtual/net/bond0/{address,operstate,statistics/*}
    class/infiniband/mlx5_<i>/{node_guid,hca_type,fw_ver,board_id,device->endpoint,
        ports/1/{state,phys_state,rate,link_layer,counters/*,hw_counters/*,gid_attrs/ndevs/0}}
    class/infiniband/mlx5_bond_0/...
    class/net/<netdev> -> the netdev directory
    bus/pci/devices/<addr> -> endpoint (NICs and GPUs)
    ethtool/<netdev>          `ethtool -S` output (rail netdevs)

Files keep their inode, as sysfs attributes do (the RDMA collector keeps counter and port
state files open and re-reads them): cumulative counters only grow, so they are rewritten
in place, which is ~40x cheaper on ext4 than a rename; a port's state, phys_state and rate
are rewritten in place, truncated first when shorter, so a read in between sees a prefix of
the old text. Other files that may shrink are replaced atomically. ``advance()`` rewrites
only the files whose value changed.
"""

from __future__ import annotations

import os
import random
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

# Same counter names as the recorded H100 node (../shared/fixtures/sysfs/class-infiniband-h100;
# tests/agent/sim/test_fake_sysfs.py compares them where it is provided).
COUNTERS = (
    "VL15_dropped",
    "excessive_buffer_overrun_errors",
    "link_downed",
    "link_error_recovery",
    "local_link_integrity_errors",
    "multicast_rcv_packets",
    "multicast_xmit_packets",
    "port_rcv_constraint_errors",
    "port_rcv_data",
    "port_rcv_errors",
    "port_rcv_packets",
    "port_rcv_remote_physical_errors",
    "port_rcv_switch_relay_errors",
    "port_xmit_constraint_errors",
    "port_xmit_data",
    "port_xmit_discards",
    "port_xmit_packets",
    "port_xmit_wait",
    "symbol_error",
    "unicast_rcv_packets",
    "unicast_xmit_packets",
)
HW_COUNTERS = (
    "duplicate_request",
    "implied_nak_seq_err",
    "lifespan",
    "local_ack_timeout_err",
    "out_of_buffer",
    "out_of_sequence",
    "packet_seq_err",
    "req_cqe_error",
    "req_cqe_flush_error",
    "req_remote_access_errors",
    "req_remote_invalid_request",
    "resp_cqe_error",
    "resp_cqe_flush_error",
    "resp_local_length_error",
    "resp_remote_access_errors",
    "rnr_nak_retry_err",
    "roce_adp_retrans",
    "roce_adp_retrans_to",
    "roce_slow_restart",
    "roce_slow_restart_cnps",
    "roce_slow_restart_trans",
    "rx_atomic_requests",
    "rx_dct_connect",
    "rx_icrc_encapsulated",
    "rx_read_requests",
    "rx_write_requests",
)
NETDEV_STATS = (
    "collisions",
    "multicast",
    "rx_bytes",
    "rx_compressed",
    "rx_crc_errors",
    "rx_dropped",
    "rx_errors",
    "rx_fifo_errors",
    "rx_frame_errors",
    "rx_length_errors",
    "rx_missed_errors",
    "rx_nohandler",
    "rx_over_errors",
    "rx_packets",
    "tx_aborted_errors",
    "tx_bytes",
    "tx_carrier_errors",
    "tx_compressed",
    "tx_dropped",
    "tx_errors",
    "tx_fifo_errors",
    "tx_heartbeat_errors",
    "tx_packets",
    "tx_window_errors",
)
_ETHTOOL_BASE = (
    "rx_packets",
    "rx_bytes",
    "tx_packets",
    "tx_bytes",
    "rx_vport_rdma_unicast_packets",
    "rx_vport_rdma_unicast_bytes",
    "tx_vport_rdma_unicast_packets",
    "tx_vport_rdma_unicast_bytes",
    "rx_out_of_buffer",
    "rx_packets_phy",
    "rx_bytes_phy",
    "tx_packets_phy",
    "tx_bytes_phy",
    "rx_crc_errors_phy",
    "rx_symbol_err_phy",
    "rx_discards_phy",
    "tx_discards_phy",
    "rx_pcs_symbol_err_phy",
    "rx_corrected_bits_phy",
    "link_down_events_phy",
)
_PRIO_STATS = ("bytes", "packets", "pause", "pause_duration", "pause_transition")
_ETHTOOL_PRIO = tuple(f"{d}_prio{p}_{s}" for p in range(8) for d in ("rx", "tx") for s in _PRIO_STATS)
_ETHTOOL_TAIL = (
    "tx_pause_storm_warning_events",
    "tx_pause_storm_error_events",
    "rx_pci_signal_integrity",
    "tx_pci_signal_integrity",
    "outbound_pci_stalled_rd",
    "outbound_pci_stalled_wr",
    "module_unplug",
    "module_bus_stuck",
    "module_high_temp",
    "module_bad_shorted",
)
ETHTOOL_ETH = _ETHTOOL_BASE + _ETHTOOL_PRIO + _ETHTOOL_TAIL
ETHTOOL_IPOIB = ("rx_packets", "rx_bytes", "tx_packets", "tx_bytes", "tx_queue_stopped", "rx_csum_none")

# IBA PortCounters error counters are narrow and saturate instead of wrapping.
_SATURATE = {
    "symbol_error": 0xFFFF,
    "port_rcv_errors": 0xFFFF,
    "port_rcv_remote_physical_errors": 0xFFFF,
    "port_rcv_switch_relay_errors": 0xFFFF,
    "port_xmit_discards": 0xFFFF,
    "VL15_dropped": 0xFFFF,
    "port_xmit_constraint_errors": 0xFF,
    "port_rcv_constraint_errors": 0xFF,
    "link_downed": 0xFF,
    "link_error_recovery": 0xFF,
    "local_link_integrity_errors": 0xF,
    "excessive_buffer_overrun_errors": 0xF,
}
_RATE_WIDTH = {
    400: "4X NDR",
    200: "4X HDR",
    100: "4X EDR",
    56: "4X FDR",
    50: "2X HDR",
    40: "4X QDR",
    25: "1X EDR",
    10: "4X SDR",
}
_PFC_PRIO = 3
_STORM_PAUSE_PER_S = 60_000
_MTU = 4096


def format_rate(gbps: float) -> str:
    """``ports/<n>/rate`` text for a rate, as the kernel prints it."""
    num = f"{gbps:g}"
    width = _RATE_WIDTH.get(int(gbps)) if float(gbps).is_integer() else None
    return f"{num} Gb/sec ({width})" if width else f"{num} Gb/sec"


def _pci(bus: int, dev: int = 0, fn: int = 0) -> str:
    return f"0000:{bus:02x}:{dev:02x}.{fn}"


@dataclass
class _Nic:
    """One fake RDMA port and its netdev; values are mirrored to files on write."""

    index: int
    rdma: str
    netdev: str
    pci: str
    link_layer: str
    nominal_gbps: float
    ib_port: str  # .../class/infiniband/<dev>/ports/1
    net_dir: str  # real netdev directory
    ethtool_path: str | None
    rate_gbps: float = 0.0
    up: bool = True
    storm: bool = False
    counters: dict[str, int] = field(default_factory=dict)
    hw: dict[str, int] = field(default_factory=dict)
    stats: dict[str, int] = field(default_factory=dict)
    ethtool: dict[str, int] = field(default_factory=dict)
    frac: dict[str, float] = field(default_factory=dict)  # fractional growth carried between ticks


class FakeSysfs:
    """Writes a realistic sysfs tree under ``root`` and mutates it on demand (thread-safe)."""

    def __init__(
        self,
        root: str,
        nics: int = 8,
        rail_link_layer: str = "Ethernet",
        rate_gbps: float = 400,
        with_bond: bool = True,
        seed: int = 0,
    ) -> None:
        if not 0 <= nics <= 28:
            raise ValueError("nics must be between 0 and 28")
        if rail_link_layer not in ("Ethernet", "InfiniBand"):
            raise ValueError("rail_link_layer is 'Ethernet' or 'InfiniBand'")
        self.root = os.path.abspath(root)
        self.rail_link_layer = rail_link_layer
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._built = False
        self._tmp = os.path.join(self.root, ".tmp")
        os.makedirs(self._tmp, exist_ok=True)
        self._nics: list[_Nic] = []
        self._gpus: list[str] = []
        for i in range(nics):
            self._build_rail(i, rate_gbps)
        if with_bond:
            self._build_bond(nics)
        self._built = True

    # -- layout ---------------------------------------------------------------------
    @property
    def ethtool_dir(self) -> str:
        """Directory holding one ``ethtool -S`` text per netdev (EthtoolCollector stats_dir)."""
        return os.path.join(self.root, "ethtool")

    def gpu_pci_addresses(self) -> list[str]:
        """GPU i's PCI address ("0000:BB:00.0"); GPU i shares a PCIe switch with NIC i."""
        return list(self._gpus)

    def nic_pci_addresses(self) -> list[str]:
        """PCI address of each NIC, rails first, then the bond's first function."""
        return [n.pci for n in self._nics]

    def rdma_devices(self) -> list[str]:
        """RDMA device names by NIC index ("mlx5_0" … then "mlx5_bond_0")."""
        return [n.rdma for n in self._nics]

    def netdevs(self) -> list[str]:
        """Netdev names by NIC index."""
        return [n.netdev for n in self._nics]

    def _w(self, path: str, text: str) -> None:
        """Write a file that may shrink: atomically (temp + rename) once collectors may be reading."""
        if not self._built:
            with open(path, "w") as fh:
                fh.write(text)
            return
        tmp = os.path.join(self._tmp, f"{threading.get_ident()}.{os.getpid()}")
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, path)

    def _put(self, path: str, text: str) -> None:
        """Rewrite a port attribute in place: sysfs keeps one inode per attribute, and the RDMA
        collector keeps these files open and re-reads them (a rename would leave it the old file).

        A shorter text truncates first, then writes: a read in between sees a prefix of the
        old text, never the new text with a stale tail.
        """
        if not self._built:
            self._w(path, text)
            return
        data = text.encode()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            if len(data) < os.fstat(fd).st_size:
                os.ftruncate(fd, len(data))
            os.pwrite(fd, data, 0)
        finally:
            os.close(fd)

    @staticmethod
    def _grow(path: str, text: str) -> None:
        """Rewrite a file whose text never gets shorter (cumulative counters) in place.

        A rename per counter forces an ext4 flush (~0.4 ms); an in-place pwrite is ~10 us,
        and since the new text is at least as long as the old one no stale tail is left.
        """
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            os.pwrite(fd, text.encode(), 0)
        finally:
            os.close(fd)

    def _mkdir(self, *parts: str) -> str:
        p = os.path.join(self.root, *parts)
        os.makedirs(p, exist_ok=True)
        return p

    def _link(self, target: str, link: str) -> None:
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if os.path.lexists(link):
            os.unlink(link)
        os.symlink(os.path.relpath(target, os.path.dirname(link)), link)

    def _endpoint(self, path: str, vendor: str, device: str, klass: str, numa: int) -> None:
        os.makedirs(path, exist_ok=True)
        for name, val in (("vendor", vendor), ("device", device), ("class", klass), ("numa_node", str(numa))):
            self._w(os.path.join(path, name), val + "\n")
        self._link(path, os.path.join(self.root, "bus", "pci", "devices", os.path.basename(path)))

    def _build_rail(self, i: int, rate: float) -> None:
        base = 0x08 + 8 * i
        numa = 0 if i < 4 else 1
        rp = _pci(base, 1)
        up = _pci(base + 1)
        sw = self._mkdir("devices", f"pci0000:{base:02x}", rp, up)
        gpu_ep = os.path.join(sw, _pci(base + 2, 0), _pci(base + 3))
        nic_ep = os.path.join(sw, _pci(base + 2, 1), _pci(base + 4))
        self._endpoint(gpu_ep, "0x10de", "0x2330", "0x030200", numa)
        self._endpoint(nic_ep, "0x15b3", "0x1021", "0x020700", numa)
        self._gpus.append(_pci(base + 3))
        eth = self.rail_link_layer == "Ethernet"
        netdev = f"ens{i + 1}f0np0" if eth else f"ibp{base + 4}s0"
        self._nics.append(
            self._build_nic(
                i,
                f"mlx5_{i}",
                netdev,
                nic_ep,
                link_layer=self.rail_link_layer,
                rate=rate,
                hca="MT4129",
                with_ethtool=eth,
                net_parent=nic_ep,
            )
        )

    def _build_bond(self, i: int) -> None:
        bus = 0xE0
        ep = os.path.join(self._mkdir("devices", f"pci0000:{bus:02x}", _pci(bus, 1)), _pci(bus + 1))
        self._endpoint(ep, "0x15b3", "0xa2dc", "0x020000", 0)
        for fn, name in ((0, "ens9f0np0"), (1, "ens9f1np1")):
            d = os.path.join(ep, "net", name)
            os.makedirs(d, exist_ok=True)
            self._w(os.path.join(d, "dev_port"), f"{fn}\n")
        vnet = self._mkdir("devices", "virtual", "net")
        nic = self._build_nic(
            i,
            "mlx5_bond_0",
            "bond0",
            ep,
            link_layer="Ethernet",
            rate=200,
            hca="MT41692",
            with_ethtool=False,
            net_parent=None,
            virtual_net=vnet,
        )
        self._nics.append(nic)

    def _build_nic(
        self,
        i: int,
        rdma: str,
        netdev: str,
        ep: str,
        *,
        link_layer: str,
        rate: float,
        hca: str,
        with_ethtool: bool,
        net_parent: str | None,
        virtual_net: str | None = None,
    ) -> _Nic:
        rng = self._rng
        dev_dir = self._mkdir("class", "infiniband", rdma)
        self._link(ep, os.path.join(dev_dir, "device"))
        self._w(
            os.path.join(dev_dir, "node_guid"), f"b83f:d203:00{rng.randrange(256):02x}:{rng.randrange(65536):04x}\n"
        )
        self._w(os.path.join(dev_dir, "hca_type"), hca + "\n")
        self._w(os.path.join(dev_dir, "fw_ver"), "28.41.1000\n")
        self._w(os.path.join(dev_dir, "board_id"), "MT_0000000838\n")
        port = self._mkdir("class", "infiniband", rdma, "ports", "1")
        for sub in ("counters", "hw_counters"):
            os.makedirs(os.path.join(port, sub), exist_ok=True)
        if link_layer == "Ethernet":
            ndevs = self._mkdir("class", "infiniband", rdma, "ports", "1", "gid_attrs", "ndevs")
            types = self._mkdir("class", "infiniband", rdma, "ports", "1", "gid_attrs", "types")
            self._w(os.path.join(ndevs, "0"), netdev + "\n")
            self._w(os.path.join(types, "0"), "RoCE v2\n")
        if virtual_net is not None:
            net_dir = os.path.join(virtual_net, netdev)
        else:
            assert net_parent is not None
            net_dir = os.path.join(net_parent, "net", netdev)
        os.makedirs(os.path.join(net_dir, "statistics"), exist_ok=True)
        self._link(net_dir, os.path.join(self.root, "class", "net", netdev))
        mac = [0xB8, 0x3F, 0xD2, rng.randrange(256), rng.randrange(256), i & 0xFF]
        self._w(os.path.join(net_dir, "address"), ":".join(f"{b:02x}" for b in mac) + "\n")
        self._w(os.path.join(net_dir, "dev_port"), "0\n")
        self._w(os.path.join(net_dir, "mtu"), "4200\n" if link_layer == "Ethernet" else "4092\n")
        ethtool_path = None
        if virtual_net is None:
            os.makedirs(self.ethtool_dir, exist_ok=True)
            ethtool_path = os.path.join(self.ethtool_dir, netdev)
        nic = _Nic(
            i,
            rdma,
            netdev,
            os.path.basename(ep),
            link_layer,
            float(rate),
            port,
            net_dir,
            ethtool_path,
            rate_gbps=float(rate),
        )
        big = rng.randrange(10**12, 10**13)
        nic.counters = dict.fromkeys(COUNTERS, 0)
        nic.counters.update(
            port_rcv_data=big,
            port_xmit_data=big + rng.randrange(10**9),
            port_rcv_packets=big // 700,
            port_xmit_packets=big // 700,
            unicast_rcv_packets=big // 700,
            unicast_xmit_packets=big // 700,
            port_xmit_wait=rng.randrange(10**6, 10**8),
        )
        nic.hw = dict.fromkeys(HW_COUNTERS, 0)
        nic.hw.update(
            lifespan=12,
            rx_write_requests=rng.randrange(10**8, 10**9),
            rx_read_requests=rng.randrange(10**6, 10**7),
            rx_dct_connect=rng.randrange(10**5),
        )
        nic.stats = dict.fromkeys(NETDEV_STATS, 0)
        nic.stats.update(
            rx_bytes=rng.randrange(10**9),
            tx_bytes=rng.randrange(10**9),
            rx_packets=rng.randrange(10**7),
            tx_packets=rng.randrange(10**7),
        )
        names = ETHTOOL_ETH if with_ethtool and link_layer == "Ethernet" else ETHTOOL_IPOIB
        nic.ethtool = dict.fromkeys(names, 0)
        for k in ("rx_packets", "tx_packets", "rx_bytes", "tx_bytes"):
            nic.ethtool[k] = nic.stats[k]
        for k, v in nic.counters.items():
            self._w(os.path.join(port, "counters", k), f"{v}\n")
        for k, v in nic.hw.items():
            self._w(os.path.join(port, "hw_counters", k), f"{v}\n")
        for k, v in nic.stats.items():
            self._w(os.path.join(net_dir, "statistics", k), f"{v}\n")
        self._w(os.path.join(port, "link_layer"), link_layer + "\n")
        self._write_link(nic)
        self._write_ethtool(nic)
        return nic

    # -- writers --------------------------------------------------------------------
    def _write_link(self, nic: _Nic) -> None:
        self._put(os.path.join(nic.ib_port, "state"), "4: ACTIVE\n" if nic.up else "1: DOWN\n")
        self._put(os.path.join(nic.ib_port, "phys_state"), "5: LinkUp\n" if nic.up else "3: Disabled\n")
        self._put(os.path.join(nic.ib_port, "rate"), format_rate(nic.rate_gbps) + "\n")
        self._w(os.path.join(nic.net_dir, "operstate"), "up\n" if nic.up else "down\n")
        self._w(os.path.join(nic.net_dir, "carrier"), "1\n" if nic.up else "0\n")

    def _write_ethtool(self, nic: _Nic) -> None:
        if nic.ethtool_path is None:
            return
        lines = ["NIC statistics:"] + [f"     {k}: {v}" for k, v in nic.ethtool.items()]
        self._grow(nic.ethtool_path, "\n".join(lines) + "\n")  # values only grow: so does the text

    def _bump(self, nic: _Nic, table: str, name: str, amount: float) -> bool:
        """Add ``amount`` (fractions carried over) to one counter; True if its value changed."""
        values: dict[str, int] = getattr(nic, table)
        if name not in values or amount <= 0:
            return False
        key = f"{table}:{name}"
        total = nic.frac.get(key, 0.0) + amount
        whole = int(total)
        nic.frac[key] = total - whole
        if whole == 0:
            return False
        old = values[name]
        new = old + whole
        cap = _SATURATE.get(name) if table == "counters" else None
        if cap is not None:
            new = min(new, cap)
        values[name] = new
        return new != old

    def _flush(self, nic: _Nic, changed: set[tuple[str, str]]) -> None:
        eth = False
        for table, name in changed:
            if table == "counters":
                self._grow(os.path.join(nic.ib_port, "counters", name), f"{nic.counters[name]}\n")
            elif table == "hw":
                self._grow(os.path.join(nic.ib_port, "hw_counters", name), f"{nic.hw[name]}\n")
            elif table == "stats":
                self._grow(os.path.join(nic.net_dir, "statistics", name), f"{nic.stats[name]}\n")
            else:
                eth = True
        if eth:
            self._write_ethtool(nic)

    def _apply(self, nic: _Nic, bumps: Sequence[tuple[str, str, float]]) -> None:
        changed = {(t, n) for t, n, a in bumps if self._bump(nic, t, n, a)}
        self._flush(nic, changed)

    def _nic(self, i: int) -> _Nic:
        if not 0 <= i < len(self._nics):
            raise IndexError(f"no NIC {i}: this node has {len(self._nics)}")
        return self._nics[i]

    # -- time -----------------------------------------------------------------------
    def advance(self, dt_s: float, throughput_gbps: float | Sequence[float] | None = None) -> None:
        """Let ``dt_s`` seconds of traffic pass: data/packet counters grow, faults keep growing theirs.

        ``throughput_gbps`` is per NIC (one number for all, or one per NIC index); by
        default each up port runs at half its current rate. Down ports move nothing.
        """
        with self._lock:
            for nic in self._nics:
                if throughput_gbps is None:
                    gbps = nic.rate_gbps * 0.5
                elif isinstance(throughput_gbps, int | float):
                    gbps = float(throughput_gbps)
                else:
                    gbps = float(throughput_gbps[nic.index]) if nic.index < len(throughput_gbps) else 0.0
                if not nic.up:
                    gbps = 0.0
                gbps = min(gbps, nic.rate_gbps)
                if nic.storm:
                    gbps *= 0.1
                byts = gbps * 1e9 / 8 * dt_s
                pkts = byts / _MTU
                bumps: list[tuple[str, str, float]] = [
                    ("counters", "port_rcv_data", byts / 4),
                    ("counters", "port_xmit_data", byts / 4),
                    ("counters", "port_rcv_packets", pkts),
                    ("counters", "port_xmit_packets", pkts),
                    ("counters", "unicast_rcv_packets", pkts),
                    ("counters", "unicast_xmit_packets", pkts),
                    ("hw", "rx_write_requests", pkts / 16),
                    ("hw", "rx_read_requests", pkts / 256),
                    ("stats", "rx_packets", 20 * dt_s if nic.up else 0),
                    ("stats", "tx_packets", 20 * dt_s if nic.up else 0),
                    ("stats", "rx_bytes", 2000 * dt_s if nic.up else 0),
                    ("stats", "tx_bytes", 2000 * dt_s if nic.up else 0),
                    ("ethtool", "rx_vport_rdma_unicast_bytes", byts),
                    ("ethtool", "tx_vport_rdma_unicast_bytes", byts),
                    ("ethtool", "rx_vport_rdma_unicast_packets", pkts),
                    ("ethtool", "tx_vport_rdma_unicast_packets", pkts),
                    ("ethtool", "rx_bytes_phy", byts),
                    ("ethtool", "tx_bytes_phy", byts),
                    ("ethtool", "rx_packets_phy", pkts),
                    ("ethtool", "tx_packets_phy", pkts),
                    ("ethtool", f"rx_prio{_PFC_PRIO}_bytes", byts),
                    ("ethtool", f"tx_prio{_PFC_PRIO}_bytes", byts),
                    ("ethtool", f"rx_prio{_PFC_PRIO}_packets", pkts),
                    ("ethtool", f"tx_prio{_PFC_PRIO}_packets", pkts),
                    # a healthy lossless fabric still pauses now and then
                    ("ethtool", f"rx_prio{_PFC_PRIO}_pause", 2 * dt_s if gbps else 0),
                    ("ethtool", f"rx_prio{_PFC_PRIO}_pause_duration", 10 * dt_s if gbps else 0),
                ]
                if nic.storm:
                    n = _STORM_PAUSE_PER_S * dt_s
                    p = _PFC_PRIO
                    bumps += [
                        ("ethtool", f"rx_prio{p}_pause", n),
                        ("ethtool", f"tx_prio{p}_pause", n),
                        ("ethtool", f"rx_prio{p}_pause_duration", 15 * n),
                        ("ethtool", f"tx_prio{p}_pause_duration", 15 * n),
                        ("ethtool", f"rx_prio{p}_pause_transition", n / 100),
                        ("ethtool", f"tx_prio{p}_pause_transition", n / 100),
                        ("ethtool", "tx_pause_storm_warning_events", dt_s / 5),
                        ("counters", "port_xmit_wait", 5e8 * dt_s),
                    ]
                elif gbps:
                    bumps.append(("counters", "port_xmit_wait", 1e4 * dt_s))
                self._apply(nic, bumps)

    # -- fault injection ------------------------------------------------------------
    def set_port_down(self, i: int) -> None:
        """NIC i's port goes DOWN/Disabled and its netdev down; link_downed counts it."""
        with self._lock:
            nic = self._nic(i)
            if nic.up:
                nic.up = False
                self._apply(nic, [("counters", "link_downed", 1), ("ethtool", "link_down_events_phy", 1)])
            self._write_link(nic)

    def set_port_up(self, i: int) -> None:
        """NIC i's port is ACTIVE/LinkUp again."""
        with self._lock:
            nic = self._nic(i)
            nic.up = True
            self._write_link(nic)

    def flap(self, i: int, count: int = 1) -> None:
        """NIC i went down and retrained ``count`` times; it ends up ACTIVE."""
        with self._lock:
            nic = self._nic(i)
            self._apply(
                nic,
                [
                    ("counters", "link_downed", count),
                    ("counters", "link_error_recovery", 2 * count),
                    ("ethtool", "link_down_events_phy", count),
                ],
            )
            nic.up = True
            self._write_link(nic)

    def error_burst(self, i: int, n: int = 1000) -> None:
        """A burst of physical-layer errors and the transport loss they cause on NIC i."""
        with self._lock:
            nic = self._nic(i)
            self._apply(
                nic,
                [
                    ("counters", "symbol_error", n),
                    ("counters", "port_rcv_errors", n // 2 or 1),
                    ("counters", "local_link_integrity_errors", 1),
                    ("hw", "out_of_sequence", n),
                    ("hw", "packet_seq_err", n // 4 or 1),
                    ("hw", "implied_nak_seq_err", n // 8 or 1),
                    ("hw", "duplicate_request", n // 4 or 1),
                    ("hw", "local_ack_timeout_err", n // 10 or 1),
                    ("ethtool", "rx_crc_errors_phy", n // 2 or 1),
                    ("ethtool", "rx_symbol_err_phy", n),
                    ("ethtool", "rx_pcs_symbol_err_phy", n),
                    ("ethtool", "rx_corrected_bits_phy", 50 * n),
                    ("stats", "rx_errors", n // 2 or 1),
                    ("stats", "rx_crc_errors", n // 2 or 1),
                ],
            )

    def degrade(self, i: int, rate_gbps: float) -> None:
        """NIC i negotiated a lower rate (a lane down, a bad cable)."""
        with self._lock:
            nic = self._nic(i)
            nic.rate_gbps = float(rate_gbps)
            self._write_link(nic)

    def restore_rate(self, i: int) -> None:
        """NIC i runs at its nominal rate again (a degraded link retrained)."""
        with self._lock:
            nic = self._nic(i)
            nic.rate_gbps = nic.nominal_gbps
            self._write_link(nic)

    def pfc_storm(self, i: int, on: bool = True) -> None:
        """NIC i sends and receives PFC pause frames on priority 3 as fast as it can (on advance)."""
        with self._lock:
            self._nic(i).storm = on

    def clear(self, i: int) -> None:
        """End every fault on NIC i: port up, nominal rate, no storm. Counters keep their values."""
        with self._lock:
            nic = self._nic(i)
            nic.up = True
            nic.storm = False
            nic.rate_gbps = nic.nominal_gbps
            self._write_link(nic)
