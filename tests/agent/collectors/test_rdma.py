"""RDMA sysfs collector (on the recorded H100 node, its generated twin and FakeSysfs) and NIC-GPU pairing."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.collectors.counterfiles import CounterFiles
from agent.collectors.pci import pair_nics_with_gpus, pci_device_path
from agent.collectors.rdma import (
    RdmaSysfsCollector,
    parse_rate_gbps,
    parse_state,
)
from agent.sim.fake_sysfs import COUNTERS, HW_COUNTERS, FakeSysfs
from starpulse.core.vocab import canonical_pci
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import shared_fixture

H100_DEVICES = ["mlx5_0", "mlx5_1", "mlx5_4", "mlx5_5", "mlx5_6", "mlx5_7", "mlx5_8", "mlx5_9", "mlx5_bond_0"]
GENERATED_DEVICES = [f"mlx5_{i}" for i in range(8)] + ["mlx5_bond_0"]


@dataclass(frozen=True)
class IbNode:
    """A sysfs root with an 8x400G NDR InfiniBand + one 200G RoCE bond node, and its RDMA devices in order."""

    root: Path
    devices: list[str]

    def writable_ib(self) -> Path:
        """``class/infiniband`` as files a test may break: the recorded tree is copied first, never changed."""
        ib = self.root / "class" / "infiniband"
        if ib.is_symlink():
            recorded = ib.resolve()
            ib.unlink()
            shutil.copytree(recorded, ib)
        return ib

    def release(self) -> None:
        """Remove the link to the recording (or the copy of it), never the recording."""
        ib = self.root / "class" / "infiniband"
        if ib.is_symlink():
            ib.unlink()
        else:
            shutil.rmtree(self.root)


@pytest.fixture
def recorded(tmp_path: Path) -> Iterator[IbNode]:
    """The recorded H100 node, read in place: its class/infiniband is a link into ../shared/fixtures."""
    target = shared_fixture("sysfs/class-infiniband-h100")
    (tmp_path / "recorded" / "class").mkdir(parents=True)
    (tmp_path / "recorded" / "class" / "infiniband").symlink_to(target, target_is_directory=True)
    node = IbNode(tmp_path / "recorded", H100_DEVICES)
    yield node
    node.release()


@pytest.fixture
def generated(tmp_path: Path) -> Iterator[IbNode]:
    """FakeSysfs shaped like the recorded node: 8 InfiniBand rails and the bond, without what the recording lacks.

    The recording has no ``device`` links, RoCE GID tables or node GUIDs; they are removed so
    that both trees hold the same kinds of files.
    """
    root = tmp_path / "generated"
    FakeSysfs(str(root), nics=8, rail_link_layer="InfiniBand")
    for dev in (root / "class" / "infiniband").iterdir():
        (dev / "device").unlink()
        (dev / "node_guid").unlink()
        shutil.rmtree(dev / "ports" / "1" / "gid_attrs", ignore_errors=True)
    node = IbNode(root, GENERATED_DEVICES)
    yield node
    node.release()


@pytest.fixture(params=["recorded", "generated"])
def h100(request: pytest.FixtureRequest) -> IbNode:
    """The recorded H100 node (skipped where ../shared is absent) and its generated twin."""
    node: IbNode = request.getfixturevalue(request.param)
    return node


def collect(c: RdmaSysfsCollector) -> tuple[tpb.Report, list]:
    r = tpb.Report()
    return r, c.collect(r)


def scan(root: Path) -> tuple[tpb.Report, list]:
    """One cycle of a fresh collector, whose kept port files are closed after."""
    c = RdmaSysfsCollector(str(root))
    try:
        return collect(c)
    finally:
        c.close()


class TestParsers:
    @pytest.mark.parametrize(
        ("text", "gbps"),
        [
            ("400 Gb/sec (4X NDR)", 400.0),
            ("25 Gb/sec (1X EDR)", 25.0),
            ("2.5 Gb/sec", 2.5),
            ("200 Gb/sec (2X NDR)\n", 200.0),
            ("", 0.0),
            ("garbage", 0.0),
        ],
    )
    def test_rate(self, text, gbps):
        """Rates parse from the kernel's "N Gb/sec (width)" text; junk is 0."""
        assert parse_rate_gbps(text) == gbps

    def test_state(self):
        """State files split into code and name."""
        assert parse_state("4: ACTIVE\n") == (4, "ACTIVE")
        assert parse_state("5: LinkUp") == (5, "LinkUp")
        assert parse_state("3: Disabled") == (3, "Disabled")
        assert parse_state("weird") == (0, "weird")

    def test_counter_dir_skips_bad_files(self, tmp_path):
        """Non-integer files and subdirectories are skipped without losing the rest."""
        (tmp_path / "good").write_text("42\n")
        (tmp_path / "bad").write_text("N/A\n")
        (tmp_path / "empty").write_text("")
        (tmp_path / "negative").write_text("-1\n")
        (tmp_path / "sub").mkdir()
        files = CounterFiles()
        assert files.read_dir(str(tmp_path)) == {"good": 42}
        assert files.read_dir(str(tmp_path / "missing")) == {}
        files.close()


class TestRdmaOnH100Layout:
    def test_supported_and_ports(self, h100):
        """The node has exactly nine ports, all port 1: the eight rails plus the bond."""
        assert RdmaSysfsCollector(str(h100.root)).supported()
        r, findings = scan(h100.root)
        assert [s.rdma_device for s in r.nics] == h100.devices
        assert all(s.port == 1 for s in r.nics)
        assert findings == []

    def test_link_and_rate(self, h100):
        """IB rails are 400G InfiniBand, the bond is 200G Ethernet, all ACTIVE/LinkUp."""
        r, _ = scan(h100.root)
        by = {s.rdma_device: s for s in r.nics}
        for dev in h100.devices[:-1]:
            assert (by[dev].rate_gbps, by[dev].link_layer) == (400.0, "InfiniBand")
        assert (by["mlx5_bond_0"].rate_gbps, by["mlx5_bond_0"].link_layer) == (200.0, "Ethernet")
        assert {(s.state_code, s.state, s.phys_state_code, s.phys_state) for s in r.nics} == {
            (4, "ACTIVE", 5, "LinkUp")
        }

    def test_counters_are_every_file_as_read(self, h100):
        """Each counters/ and hw_counters/ file is one entry of its own map, with the file's integer."""
        r, _ = scan(h100.root)
        for s in r.nics:
            port = h100.root / "class" / "infiniband" / s.rdma_device / "ports" / "1"
            for sub, got in (("counters", s.counters), ("hw_counters", s.hw_counters)):
                assert dict(got) == {f.name: int(f.read_text()) for f in (port / sub).iterdir()}
        assert (set(r.nics[0].counters), set(r.nics[0].hw_counters)) == (set(COUNTERS), set(HW_COUNTERS))

    def test_no_device_links(self, h100):
        """Without device links there is no netdev, PCI address or NUMA node, and no netdev stats."""
        r, _ = scan(h100.root)
        assert all(s.netdev == "" and not s.netdev_stats and s.netdev_operstate == "" for s in r.nics)
        inv = ipb.Inventory()
        RdmaSysfsCollector(str(h100.root)).describe(inv)
        assert len(inv.nics) == 9
        n0 = inv.nics[0]
        assert (n0.rdma_device, n0.port, n0.link_layer, n0.rate_gbps) == ("mlx5_0", 1, "InfiniBand", 400.0)
        assert (n0.hca_type, n0.fw_version, n0.board_id) == ("MT4129", "28.41.1000", "MT_0000000838")
        assert (n0.netdev, n0.pci_address, n0.numa_node, n0.mac, n0.node_guid) == ("", "", -1, "", "")
        assert inv.nics[-1].hca_type == "MT41692"

    def test_broken_files_and_ports_lose_nothing_else(self, h100):
        """A garbage counter is skipped and a port without state is dropped; the rest still report."""
        ib = h100.writable_ib()
        (ib / "mlx5_0" / "ports" / "1" / "counters" / "symbol_error").write_text("oops\n")
        (ib / "mlx5_4" / "ports" / "1" / "state").unlink()
        r, findings = scan(h100.root)
        devs = [s.rdma_device for s in r.nics]
        assert "mlx5_4" not in devs and len(devs) == 8
        assert "symbol_error" not in r.nics[0].counters and len(r.nics[0].counters) == 20
        assert findings == []


class TestRdmaOnRecordedH100:
    def test_counters(self, recorded):
        """The recorded counters read as uint64, port counters and hw counters separately."""
        r, _ = scan(recorded.root)
        s = r.nics[0]
        assert s.rdma_device == "mlx5_0"
        assert s.counters["port_rcv_data"] == 230539874932483
        assert s.counters["port_xmit_data"] == 230442669431839
        assert s.counters["excessive_buffer_overrun_errors"] == 15
        assert s.counters["port_rcv_errors"] == 14
        assert len(s.counters) == 21
        assert s.hw_counters["rx_write_requests"] == 3809045607
        assert s.hw_counters["lifespan"] == 12
        assert s.hw_counters["roce_adp_retrans"] == 3
        assert len(s.hw_counters) == 26

    def test_the_recording_is_unchanged_by_a_broken_copy(self, recorded):
        """Breaking the writable copy leaves the recorded files in ../shared as they were."""
        target = (recorded.root / "class" / "infiniband").resolve()
        (recorded.writable_ib() / "mlx5_0" / "ports" / "1" / "state").unlink()
        assert (target / "mlx5_0" / "ports" / "1" / "state").read_text().strip() == "4: ACTIVE"


class TestRdmaOnGeneratedH100:
    def test_counters_are_uint64(self, generated):
        """Counters up to 2^64-1 are kept, one past it is dropped, without losing the port's other counters."""
        port = generated.root / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        (port / "counters" / "port_rcv_data").write_text(f"{2**64 - 1}\n")
        (port / "hw_counters" / "rx_write_requests").write_text(f"{2**64}\n")
        s = scan(generated.root)[0].nics[0]
        assert s.counters["port_rcv_data"] == 2**64 - 1
        assert "rx_write_requests" not in s.hw_counters
        assert (len(s.counters), len(s.hw_counters)) == (21, 25)
        assert s.counters["port_xmit_data"] > 2**32  # FakeSysfs starts data counters past 32 bits


class TestRdmaOnFakeSysfs:
    def test_inventory(self, tmp_path):
        """FakeSysfs NICs describe fully: netdev, MAC, PCI address, NUMA node, GUID."""
        fs = FakeSysfs(str(tmp_path), nics=8)
        inv = ipb.Inventory()
        RdmaSysfsCollector(str(tmp_path)).describe(inv)
        assert [n.rdma_device for n in inv.nics] == fs.rdma_devices()
        assert [n.netdev for n in inv.nics] == fs.netdevs()
        assert [n.pci_address for n in inv.nics] == fs.nic_pci_addresses()
        assert [n.numa_node for n in inv.nics] == [0, 0, 0, 0, 1, 1, 1, 1, 0]
        assert all(len(n.mac.split(":")) == 6 and n.node_guid.count(":") == 3 for n in inv.nics)
        assert inv.nics[-1].netdev == "bond0" and inv.nics[-1].rate_gbps == 200.0

    def test_netdev_stats_and_operstate(self, tmp_path):
        """Samples carry the netdev's statistics and operstate."""
        FakeSysfs(str(tmp_path), nics=2)
        r, _ = collect(RdmaSysfsCollector(str(tmp_path)))
        assert [s.netdev for s in r.nics] == ["ens1f0np0", "ens2f0np0", "bond0"]
        assert all(s.netdev_operstate == "up" and "rx_bytes" in s.netdev_stats for s in r.nics)

    def test_infiniband_rails_use_device_net(self, tmp_path):
        """IB rails have no RoCE GID netdev; the IPoIB netdev comes from device/net."""
        FakeSysfs(str(tmp_path), nics=2, rail_link_layer="InfiniBand", with_bond=False)
        r, _ = collect(RdmaSysfsCollector(str(tmp_path)))
        assert [s.netdev for s in r.nics] == ["ibp12s0", "ibp20s0"]
        assert {s.link_layer for s in r.nics} == {"InfiniBand"}

    def test_link_down_and_up_transitions(self, tmp_path):
        """Down once -> one critical nic_link_down; back ACTIVE -> one info nic_link_up."""
        fs = FakeSysfs(str(tmp_path), nics=4)
        c = RdmaSysfsCollector(str(tmp_path))
        assert collect(c)[1] == []
        fs.set_port_down(2)
        r, findings = collect(c)
        assert [(f.kind, f.component, f.severity, f.action) for f in findings] == [
            ("nic_link_down", "mlx5_2/1", "critical", "check_link")
        ]
        assert findings[0].attributes["netdev"] == "ens3f0np0"
        assert r.nics[2].state == "DOWN" and r.nics[2].netdev_operstate == "down"
        assert collect(c)[1] == []  # no repeat while it stays down
        fs.set_port_up(2)
        findings = collect(c)[1]
        assert [(f.kind, f.component, f.severity, f.action) for f in findings] == [
            ("nic_link_up", "mlx5_2/1", "info", "none")
        ]

    def test_first_collect_reports_a_port_already_down(self, tmp_path):
        """A port already down on the first cycle is a finding, so a one-shot scan sees it."""
        fs = FakeSysfs(str(tmp_path), nics=2)
        fs.set_port_down(1)
        findings = collect(RdmaSysfsCollector(str(tmp_path)))[1]
        assert [(f.kind, f.component) for f in findings] == [("nic_link_down", "mlx5_1/1")]

    def test_counters_grow_raw(self, tmp_path):
        """Counters are raw cumulative values that grow as the fake advances."""
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path))
        a = collect(c)[0].nics[0]
        fs.advance(1.0, throughput_gbps=100)
        b = collect(c)[0].nics[0]
        grew = (b.counters["port_xmit_data"] - a.counters["port_xmit_data"]) * 4 * 8 / 1e9
        assert grew == pytest.approx(100, rel=0.01)


class TestPciPairing:
    def test_normalize(self):
        """NVML bus ids lose their extra domain zeros; case is folded."""
        assert canonical_pci("00000000:17:00.0") == "0000:17:00.0"
        assert canonical_pci("0000:9B:00.0") == "0000:9b:00.0"
        assert canonical_pci("0000:17:00.0") == "0000:17:00.0"

    def test_fake_sysfs_pairs_gpu_i_with_nic_i(self, tmp_path):
        """Each rail NIC pairs with the GPU behind its switch; the bond pairs with none."""
        fs = FakeSysfs(str(tmp_path), nics=8)
        nics = {f"{d}/1": a for d, a in zip(fs.rdma_devices(), fs.nic_pci_addresses(), strict=True)}
        gpus = {i: "0000" + a for i, a in enumerate(fs.gpu_pci_addresses())}  # NVML style
        pairs = pair_nics_with_gpus(str(tmp_path), nics, gpus)
        assert pairs == {f"mlx5_{i}/1": i for i in range(8)}

    def _tree(self, root: Path, endpoints: dict[str, str]) -> None:
        for addr, rel in endpoints.items():
            d = root / "devices" / rel
            d.mkdir(parents=True)
            link = root / "bus" / "pci" / "devices" / addr
            link.parent.mkdir(parents=True, exist_ok=True)
            os.symlink(d, link)

    def test_tie_and_none_are_unpaired(self, tmp_path):
        """Two GPUs equally close leave the NIC unpaired; a NIC sharing no bridge pairs with none."""
        sw = "pci0000:10/0000:10:01.0/0000:11:00.0"
        self._tree(
            tmp_path,
            {
                "0000:13:00.0": f"{sw}/0000:12:00.0/0000:13:00.0",  # GPU 0
                "0000:15:00.0": f"{sw}/0000:12:01.0/0000:15:00.0",  # GPU 1
                "0000:17:00.0": f"{sw}/0000:12:02.0/0000:17:00.0",  # NIC A: same switch as both
                "0000:91:00.0": "pci0000:90/0000:90:01.0/0000:91:00.0",  # NIC B: other root complex
                "0000:a1:00.0": "pci0000:a0/0000:a0:01.0/0000:a1:00.0",  # GPU 2
            },
        )
        pairs = pair_nics_with_gpus(
            str(tmp_path),
            {"A": "0000:17:00.0", "B": "0000:91:00.0", "C": "", "D": "0000:ff:00.0"},
            {0: "00000000:13:00.0", 1: "00000000:15:00.0", 2: "0000:a1:00.0", 3: "0000:ee:00.0"},
        )
        assert pairs == {}
        assert pci_device_path(str(tmp_path), "0000:ff:00.0") is None
