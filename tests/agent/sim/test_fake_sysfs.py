"""FakeSysfs: layout matching the recorded node, traffic, and fault injection seen through the real collectors."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent.collectors.ethtool import EthtoolCollector, parse_ethtool_stats
from agent.collectors.rdma import RdmaSysfsCollector
from agent.sim.fake_sysfs import COUNTERS, HW_COUNTERS, FakeSysfs, format_rate
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import shared_fixture


def sample(root: str, i: int) -> tpb.NicSample:
    r = tpb.Report()
    RdmaSysfsCollector(root).collect(r)
    return r.nics[i]


def ethtool(fs: FakeSysfs, netdev: str) -> dict[str, int]:
    return parse_ethtool_stats(Path(fs.ethtool_dir, netdev).read_text())


class TestLayout:
    def test_counter_names_match_the_recorded_node(self, tmp_path):
        """Every port has the same counters/ and hw_counters/ files as the real H100 node."""
        recorded_port = shared_fixture("sysfs/class-infiniband-h100/mlx5_0/ports/1")
        FakeSysfs(str(tmp_path), nics=2)
        for dev in ("mlx5_0", "mlx5_1", "mlx5_bond_0"):
            port = tmp_path / "class" / "infiniband" / dev / "ports" / "1"
            for sub in ("counters", "hw_counters"):
                assert sorted(os.listdir(port / sub)) == sorted(os.listdir(recorded_port / sub))

    def test_every_port_has_the_named_counter_files(self, tmp_path):
        """Each port holds exactly one file per COUNTERS and HW_COUNTERS name; the bond comes last."""
        FakeSysfs(str(tmp_path), nics=2)
        for dev in ("mlx5_0", "mlx5_1", "mlx5_bond_0"):
            port = tmp_path / "class" / "infiniband" / dev / "ports" / "1"
            assert sorted(os.listdir(port / "counters")) == sorted(COUNTERS)
            assert sorted(os.listdir(port / "hw_counters")) == sorted(HW_COUNTERS)
        assert (len(COUNTERS), len(HW_COUNTERS)) == (21, 26)
        assert sorted(p.name for p in (tmp_path / "class" / "infiniband").iterdir()) == [
            "mlx5_0",
            "mlx5_1",
            "mlx5_bond_0",
        ]

    def test_device_links_and_pci(self, tmp_path):
        """device is a symlink to a PCI endpoint with numa_node and net/<netdev>; bus/pci/devices links."""
        fs = FakeSysfs(str(tmp_path), nics=2)
        dev = tmp_path / "class" / "infiniband" / "mlx5_1" / "device"
        assert dev.is_symlink()
        assert os.path.basename(os.path.realpath(dev)) == fs.nic_pci_addresses()[1]
        assert (dev / "numa_node").read_text() == "0\n"
        assert (dev / "net" / "ens2f0np0" / "address").exists()
        for addr in fs.nic_pci_addresses() + fs.gpu_pci_addresses():
            assert (tmp_path / "bus" / "pci" / "devices" / addr).is_symlink()
        assert (tmp_path / "class" / "net" / "bond0" / "operstate").read_text() == "up\n"
        assert len(fs.gpu_pci_addresses()) == 2

    def test_without_bond(self, tmp_path):
        """with_bond=False leaves only the rails."""
        fs = FakeSysfs(str(tmp_path), nics=3, with_bond=False)
        assert fs.rdma_devices() == ["mlx5_0", "mlx5_1", "mlx5_2"]

    def test_rate_text(self):
        """Rates are written as the kernel prints them."""
        assert format_rate(400) == "400 Gb/sec (4X NDR)"
        assert format_rate(200) == "200 Gb/sec (4X HDR)"
        assert format_rate(2.5) == "2.5 Gb/sec"

    def test_same_seed_same_tree(self, tmp_path):
        """The tree is deterministic for a seed."""
        a = FakeSysfs(str(tmp_path / "a"), nics=2, seed=7)
        b = FakeSysfs(str(tmp_path / "b"), nics=2, seed=7)
        assert sample(a.root, 0).counters == sample(b.root, 0).counters

    def test_bad_arguments(self, tmp_path):
        """Unknown link layers and NIC indices are refused."""
        with pytest.raises(ValueError):
            FakeSysfs(str(tmp_path / "x"), rail_link_layer="Token Ring")
        fs = FakeSysfs(str(tmp_path / "y"), nics=1)
        with pytest.raises(IndexError):
            fs.set_port_down(5)


class TestAdvance:
    def test_traffic_grows_data_counters(self, tmp_path):
        """advance() grows data and packet counters by the given throughput."""
        fs = FakeSysfs(str(tmp_path), nics=2, with_bond=False)
        before = sample(fs.root, 0)
        fs.advance(2.0, throughput_gbps=[100, 0])
        after = sample(fs.root, 0)
        assert (after.counters["port_rcv_data"] - before.counters["port_rcv_data"]) * 4 == 25_000_000_000
        assert after.counters["port_xmit_packets"] > before.counters["port_xmit_packets"]
        assert after.hw_counters["rx_write_requests"] > before.hw_counters["rx_write_requests"]
        idle = sample(fs.root, 1)
        fs.advance(1.0, throughput_gbps=[100, 0])
        assert sample(fs.root, 1).counters["port_rcv_data"] == idle.counters["port_rcv_data"]
        assert ethtool(fs, "ens1f0np0")["rx_bytes_phy"] > 0

    def test_only_changed_files_are_rewritten(self, tmp_path):
        """Error counters and state files are not touched by a traffic tick."""
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        untouched = [port / "counters" / "symbol_error", port / "state", port / "rate"]
        mtimes = [p.stat().st_mtime_ns for p in untouched]
        data_before = (port / "counters" / "port_rcv_data").stat().st_mtime_ns
        time.sleep(0.01)
        fs.advance(1.0)
        assert [p.stat().st_mtime_ns for p in untouched] == mtimes
        assert (port / "counters" / "port_rcv_data").stat().st_mtime_ns > data_before

    def test_down_port_moves_nothing(self, tmp_path):
        """A down port's data counters stay still."""
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        fs.set_port_down(0)
        before = sample(fs.root, 0).counters["port_rcv_data"]
        fs.advance(1.0)
        assert sample(fs.root, 0).counters["port_rcv_data"] == before

    def test_advance_is_cheap(self, tmp_path):
        """One tick of a 9-NIC node takes well under 100 ms (it runs for dozens of nodes a second)."""
        fs = FakeSysfs(str(tmp_path))
        fs.advance(1.0)
        t = time.perf_counter()
        for _ in range(10):
            fs.advance(1.0)
        assert (time.perf_counter() - t) / 10 < 0.1


class TestFaults:
    def test_port_down_up(self, tmp_path):
        """set_port_down shows DOWN/Disabled and operstate down, counts link_downed; set_port_up restores."""
        fs = FakeSysfs(str(tmp_path), nics=2)
        fs.set_port_down(1)
        s = sample(fs.root, 1)
        assert (s.state_code, s.phys_state, s.netdev_operstate) == (1, "Disabled", "down")
        assert s.counters["link_downed"] == 1
        assert ethtool(fs, "ens2f0np0")["link_down_events_phy"] == 1
        fs.set_port_up(1)
        s = sample(fs.root, 1)
        assert (s.state, s.phys_state_code, s.netdev_operstate) == ("ACTIVE", 5, "up")

    def test_bond_is_the_last_index(self, tmp_path):
        """The bond is NIC index ``nics`` and takes faults too."""
        fs = FakeSysfs(str(tmp_path), nics=2)
        fs.set_port_down(2)
        assert sample(fs.root, 2).rdma_device == "mlx5_bond_0"
        assert sample(fs.root, 2).state == "DOWN"

    def test_flap(self, tmp_path):
        """flap() counts link_downed and link_error_recovery and ends up ACTIVE."""
        fs = FakeSysfs(str(tmp_path), nics=1)
        fs.flap(0, count=3)
        s = sample(fs.root, 0)
        assert s.counters["link_downed"] == 3 and s.counters["link_error_recovery"] >= 3
        assert s.state == "ACTIVE"
        assert ethtool(fs, "ens1f0np0")["link_down_events_phy"] == 3

    def test_error_burst(self, tmp_path):
        """error_burst grows PHY and transport error counters in sysfs and ethtool."""
        fs = FakeSysfs(str(tmp_path), nics=1)
        fs.error_burst(0, n=1000)
        s = sample(fs.root, 0)
        assert s.counters["symbol_error"] == 1000 and s.counters["port_rcv_errors"] == 500
        assert s.hw_counters["out_of_sequence"] == 1000 and s.hw_counters["local_ack_timeout_err"] == 100
        e = ethtool(fs, "ens1f0np0")
        assert e["rx_crc_errors_phy"] == 500 and e["rx_symbol_err_phy"] == 1000

    def test_iba_error_counters_saturate(self, tmp_path):
        """Narrow IBA error counters stop at their maximum instead of wrapping."""
        fs = FakeSysfs(str(tmp_path), nics=1)
        fs.error_burst(0, n=100_000)
        assert sample(fs.root, 0).counters["symbol_error"] == 0xFFFF
        assert sample(fs.root, 0).hw_counters["out_of_sequence"] == 100_000

    def test_degrade_and_clear(self, tmp_path):
        """degrade lowers the rate file; clear restores the nominal rate and keeps counters."""
        fs = FakeSysfs(str(tmp_path), nics=1)
        fs.degrade(0, 200)
        assert (tmp_path / "class/infiniband/mlx5_0/ports/1/rate").read_text() == "200 Gb/sec (4X HDR)\n"
        assert sample(fs.root, 0).rate_gbps == 200.0
        fs.error_burst(0, 10)
        fs.clear(0)
        s = sample(fs.root, 0)
        assert s.rate_gbps == 400.0 and s.counters["symbol_error"] == 10

    def test_restore_rate_leaves_the_rest(self, tmp_path):
        """restore_rate ends a degradation only: a port that is down stays down, a storm keeps storming."""
        fs = FakeSysfs(str(tmp_path), nics=1)
        fs.degrade(0, 200)
        fs.set_port_down(0)
        fs.pfc_storm(0)
        fs.restore_rate(0)
        s = sample(fs.root, 0)
        assert s.rate_gbps == 400.0 and s.state == "DOWN"
        fs.set_port_up(0)
        netdev = fs.netdevs()[0]
        before = ethtool(fs, netdev)["rx_prio3_pause"]
        fs.advance(1.0)
        assert ethtool(fs, netdev)["rx_prio3_pause"] - before >= 50_000

    def test_pfc_storm_through_the_ethtool_collector(self, tmp_path):
        """pfc_storm makes rx/tx_prio3_pause grow fast as the ethtool collector sees them; off stops it."""
        fs = FakeSysfs(str(tmp_path), nics=2)
        c = EthtoolCollector(stats_dir=fs.ethtool_dir, min_interval_s=0.0)
        assert c.supported()

        def stats() -> dict[str, int]:
            r = tpb.Report()
            RdmaSysfsCollector(fs.root).collect(r)
            c.collect(r)
            return dict(r.nics[1].ethtool_stats)

        fs.advance(1.0)
        a = stats()
        fs.pfc_storm(1)
        fs.advance(1.0)
        b = stats()
        assert b["tx_prio3_pause"] - a["tx_prio3_pause"] >= 50_000
        assert b["rx_prio3_pause"] - a["rx_prio3_pause"] >= 50_000
        fs.pfc_storm(1, on=False)
        fs.advance(1.0)
        c2 = stats()
        assert c2["tx_prio3_pause"] == b["tx_prio3_pause"]
