"""Tiered collection: slow-moving counters are read fully every slow_every_s, link state every cycle."""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.collectors import rdma
from agent.collectors.counterfiles import FileBudget
from agent.collectors.gpu import NvmlGpuCollector
from agent.collectors.rdma import RdmaSysfsCollector
from agent.sim.fake_nvml import FakeNvml
from agent.sim.fake_sysfs import FakeSysfs
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb


def nic_report(c: RdmaSysfsCollector) -> tpb.Report:
    r = tpb.Report()
    c.collect(r)
    return r


class TestNicTiers:
    def test_error_counters_reused_traffic_and_state_fresh(self, tmp_path: Path) -> None:
        """Between full reads the report still carries every counter; traffic and link state are current."""
        fs = FakeSysfs(str(tmp_path), nics=2)
        c = RdmaSysfsCollector(str(tmp_path))
        c.slow_every_s = 3600.0
        first = nic_report(c)
        fs.advance(1.0, throughput_gbps=[100.0, 100.0])
        fs.error_burst(1, 500)
        fs.set_port_down(0)
        second = nic_report(c)
        a, b = first.nics[1], second.nics[1]
        assert set(b.counters) == set(a.counters) and set(b.hw_counters) == set(a.hw_counters)
        assert b.counters["symbol_error"] == a.counters["symbol_error"]  # not re-read yet
        assert b.hw_counters["out_of_sequence"] == a.hw_counters["out_of_sequence"]
        assert b.counters["port_xmit_data"] > a.counters["port_xmit_data"]  # fast: read every cycle
        assert b.netdev_stats["tx_bytes"] > a.netdev_stats["tx_bytes"]
        assert second.nics[0].state == "DOWN"  # link state: every cycle
        assert second.nics[0].counters["link_downed"] == first.nics[0].counters["link_downed"] + 1
        c.slow_every_s = 0.0
        third = nic_report(c)
        assert third.nics[1].counters["symbol_error"] == a.counters["symbol_error"] + 500
        assert third.nics[1].hw_counters["out_of_sequence"] > a.hw_counters["out_of_sequence"]

    def test_default_reads_everything_every_cycle(self, tmp_path: Path) -> None:
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path))
        before = nic_report(c).nics[0].counters["symbol_error"]
        fs.error_burst(0, 10)
        assert nic_report(c).nics[0].counters["symbol_error"] == before + 10


class TestNvlinkTiers:
    def test_nvlink_counters_reused_state_fresh(self) -> None:
        fake = FakeNvml(gpu_count=1, seed=3)
        c = NvmlGpuCollector(fake)
        assert c.supported()
        c.slow_every_s = 3600.0
        r1 = tpb.Report()
        c.collect(r1)
        fake.inject_nvlink_down(0, link=2)  # link 2 down and its recovery counter +1
        r2 = tpb.Report()
        c.collect(r2)
        l1, l2 = r1.gpus[0].nvlinks[2], r2.gpus[0].nvlinks[2]
        assert l1.up and not l2.up
        assert l2.HasField("recovery_errors") and l2.recovery_errors == l1.recovery_errors
        c.slow_every_s = 0.0
        r3 = tpb.Report()
        c.collect(r3)
        assert r3.gpus[0].nvlinks[2].recovery_errors == l1.recovery_errors + 1
        c.close()


def _fewer_links(fake: FakeNvml) -> None:
    fake.gpu(2).nvlink_count = 12  # links 12-17 answer InvalidArgument: absent from the sample


class TestKeptNvlinks:
    """Between full reads a GPU's nvlinks are merged from one kept message; the same as the per-link loop."""

    def test_same_as_full_read_with_the_last_full_reads_counters(self) -> None:
        full, tiered = FakeNvml(gpu_count=4, seed=9), FakeNvml(gpu_count=4, seed=9)
        a, b = NvmlGpuCollector(full), NvmlGpuCollector(tiered)
        for c in (a, b):
            assert c.supported()
            c.describe(ipb.Inventory())
        b.slow_every_s = 3600.0
        first_a, first_b = tpb.Report(), tpb.Report()
        a.collect(first_a)
        b.collect(first_b)
        assert first_a == first_b
        counted = {(g.index, nl.link): nl for g in first_a.gpus for nl in g.nvlinks}
        steps: list[Callable[[FakeNvml], None]] = [
            lambda f: None,
            lambda f: f.inject_nvlink_down(1, link=2),  # a state changes (and a counter, not re-read yet)
            lambda f: None,
            lambda f: f.inject_nvlink_down(1, link=17),
            lambda f: f.clear(1),  # both links up again
            _fewer_links,
            lambda f: None,
        ]
        try:
            for step in steps:
                step(full)
                step(tiered)
                ra, rb = tpb.Report(), tpb.Report()
                a.collect(ra)
                b.collect(rb)
                for ga, gb in zip(ra.gpus, rb.gpus, strict=True):
                    expected = tpb.GpuSample()
                    expected.CopyFrom(ga)
                    del expected.nvlinks[:]
                    for nl in ga.nvlinks:  # this cycle's links and states, the first read's counters
                        kept = expected.nvlinks.add()
                        kept.CopyFrom(counted[(ga.index, nl.link)])
                        kept.up = nl.up
                    assert gb == expected
            assert [nl.link for nl in rb.gpus[2].nvlinks] == list(range(12))
        finally:
            a.close()
            b.close()

    def test_link_down_found_once_per_change_between_full_reads(self) -> None:
        fake = FakeNvml(gpu_count=2, seed=4)
        c = NvmlGpuCollector(fake)
        assert c.supported()
        c.describe(ipb.Inventory())
        c.slow_every_s = 3600.0

        def downs() -> list[str]:
            return [f.message for f in c.collect(tpb.Report()) if f.kind == "nvlink_down"]

        try:
            assert downs() == [] and downs() == []
            fake.inject_nvlink_down(1, link=4)
            assert downs() == ["NVLink 4 is down"]
            assert downs() == [] and downs() == []  # the same kept links: nothing new
            fake.clear(1)
            assert downs() == []
            fake.inject_nvlink_down(1, link=4)
            assert downs() == ["NVLink 4 is down"]
        finally:
            c.close()


class TestNicListing:
    """The device/port listing (with netdev and link layer) is kept between full counter reads."""

    def test_removed_device_drops_at_once_new_one_within_the_tier(self, tmp_path: Path) -> None:
        FakeSysfs(str(tmp_path), nics=2)
        ib = tmp_path / "class" / "infiniband"
        c = RdmaSysfsCollector(str(tmp_path))
        c.slow_every_s = 3600.0
        assert [n.rdma_device for n in nic_report(c).nics] == ["mlx5_0", "mlx5_1", "mlx5_bond_0"]
        parked = tmp_path / "parked-mlx5_1"
        (ib / "mlx5_1").rename(parked)  # the device goes away (driver reset, unplug)
        assert [n.rdma_device for n in nic_report(c).nics] == ["mlx5_0", "mlx5_bond_0"]
        assert c._failing == set()  # gone, not failing: no warning
        parked.rename(ib / "mlx5_1")  # and comes back: listed again at the next re-list
        assert [n.rdma_device for n in nic_report(c).nics] == ["mlx5_0", "mlx5_1", "mlx5_bond_0"]
        # A device new since the last listing waits for the next re-list (slow_every_s).
        (ib / "mlx5_1").rename(tmp_path / "elsewhere")
        nic_report(c)
        nic_report(c)  # re-listed after the removal: mlx5_1 gone
        (tmp_path / "elsewhere").rename(ib / "mlx5_1")
        assert "mlx5_1" not in [n.rdma_device for n in nic_report(c).nics]
        c.slow_every_s = 0.0
        assert "mlx5_1" in [n.rdma_device for n in nic_report(c).nics]

    def test_listing_kept_between_full_reads(self, tmp_path: Path) -> None:
        """Between re-lists a cycle reads no directory listing, netdev or link layer."""
        FakeSysfs(str(tmp_path), nics=2)
        c = RdmaSysfsCollector(str(tmp_path))
        c.slow_every_s = 3600.0
        first = nic_report(c)
        (tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "link_layer").write_text("InfiniBand\n")
        second = nic_report(c)
        assert second.nics[0].link_layer == first.nics[0].link_layer == "Ethernet"
        assert [n.netdev for n in second.nics] == [n.netdev for n in first.nics]
        c.slow_every_s = 0.0
        assert nic_report(c).nics[0].link_layer == "InfiniBand"


class TestInPlaceSamples:
    def test_port_failing_part_way_leaves_no_partial_sample(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Samples are filled where they lie in the report: one that fails after it was added is removed."""
        FakeSysfs(str(tmp_path), nics=2)
        c = RdmaSysfsCollector(str(tmp_path))
        real = c._counters.read_dir

        def flaky(path: str) -> dict[str, int]:
            if "/mlx5_1/" in path:
                raise RuntimeError("boom")
            return real(path)

        monkeypatch.setattr(c._counters, "read_dir", flaky)
        r = nic_report(c)
        assert [n.rdma_device for n in r.nics] == ["mlx5_0", "mlx5_bond_0"]
        assert all(n.counters for n in r.nics)


class TestKeptCounterFiles:
    """Counter files stay open between reads (pread at offset 0); re-created ones are reopened."""

    def test_recreated_counter_dir_is_read_afresh(self, tmp_path: Path) -> None:
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path))
        before = nic_report(c).nics[0].counters["symbol_error"]
        fs.error_burst(0, 7)  # written in place: the kept file sees it
        assert nic_report(c).nics[0].counters["symbol_error"] == before + 7
        counters = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "counters"
        fresh = tmp_path / "fresh"
        shutil.copytree(counters, fresh)
        (fresh / "symbol_error").write_text("12345\n")
        shutil.rmtree(counters)
        fresh.rename(counters)  # the driver re-created the directory: new files, new inodes
        assert nic_report(c).nics[0].counters["symbol_error"] == 12345

    def test_no_fd_budget_still_reads(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path), budget=FileBudget(0, 0))
        before = nic_report(c).nics[0].counters["symbol_error"]
        fs.error_burst(0, 3)
        assert nic_report(c).nics[0].counters["symbol_error"] == before + 3


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


class TestKeptPortFiles:
    """A port's state, phys_state and rate files stay open between cycles (pread at offset 0)."""

    def test_state_changes_are_seen_and_close_releases_the_files(self, tmp_path: Path) -> None:
        fs = FakeSysfs(str(tmp_path), nics=2)
        before = _open_fds()
        budget = FileBudget(0, 4096)  # its own: what other tests' collectors keep does not count
        c = RdmaSysfsCollector(str(tmp_path), budget=budget)
        c.slow_every_s = 3600.0
        assert nic_report(c).nics[1].state == "ACTIVE"
        kept = _open_fds() - before
        assert kept >= 9  # 3 ports x state, phys_state, rate (and the counter directories)
        fs.set_port_down(1)
        fs.degrade(0, 200.0)
        r = nic_report(c)
        assert (r.nics[1].state, r.nics[1].phys_state) == ("DOWN", "Disabled")
        assert r.nics[0].rate_gbps == 200.0
        assert _open_fds() - before == kept  # read through the same files
        assert budget.kept > 0
        c.close()
        assert _open_fds() == before  # port files and counter directories alike
        assert budget.kept == 0

    def test_a_collector_dropped_without_close_gives_its_files_back(self, tmp_path: Path) -> None:
        """A simulated cluster's agents come and go in one process: none may keep the budget."""
        FakeSysfs(str(tmp_path), nics=2)
        before = _open_fds()
        budget = FileBudget(0, 4096)
        c = RdmaSysfsCollector(str(tmp_path), budget=budget)
        nic_report(c)
        assert budget.kept > 0 and _open_fds() > before
        del c
        assert budget.kept == 0 and _open_fds() == before

    def test_enodev_reopens_by_path(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """On sysfs a removed device's open attribute answers ENODEV: the file is opened again by its path."""
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path))
        c.slow_every_s = 3600.0
        nic_report(c)
        port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        state = port / "state"
        stale = state.with_name("state.old")
        state.rename(stale)  # the kept file is now the old one; ENODEV says so on sysfs
        state.write_text("1: DOWN\n")
        gone = stale.stat().st_ino
        real = os.pread

        def pread(fd: int, n: int, offset: int) -> bytes:
            if os.fstat(fd).st_ino == gone:
                raise OSError(errno.ENODEV, "No such device")
            return real(fd, n, offset)

        monkeypatch.setattr(rdma.os, "pread", pread)
        assert nic_report(c).nics[0].state == "DOWN"
        assert os.fstat(c._port_files[str(port)].fds["state"]).st_ino == state.stat().st_ino
        assert fs.rdma_devices() == ["mlx5_0"]

    def test_vanished_port_directory_drops_at_once_and_comes_back(self, tmp_path: Path) -> None:
        FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path))
        c.slow_every_s = 3600.0
        assert nic_report(c).nics[0].state == "ACTIVE"
        port = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1"
        parked = tmp_path / "parked"
        shutil.copytree(port, parked)
        shutil.rmtree(port)
        assert list(nic_report(c).nics) == []  # gone: no sample from the files still open
        parked.rename(port)
        assert nic_report(c).nics[0].state == "ACTIVE"
        fresh = tmp_path / "fresh"
        shutil.copytree(port, fresh)
        (fresh / "state").write_text("2: INIT\n")
        shutil.rmtree(port)
        fresh.rename(port)  # re-created between two cycles: another inode, its files read afresh
        assert nic_report(c).nics[0].state == "INIT"

    def test_file_replaced_in_place_is_read_again_by_the_next_relist(self, tmp_path: Path) -> None:
        """A regular file replaced within the same directory has no ENODEV: the re-list reopens it."""
        FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path))
        c.slow_every_s = 3600.0
        nic_report(c)
        rate = tmp_path / "class" / "infiniband" / "mlx5_0" / "ports" / "1" / "rate"
        rate.unlink()
        rate.write_text("100 Gb/sec (4X EDR)\n")
        c.slow_every_s = 0.0
        assert nic_report(c).nics[0].rate_gbps == 100.0

    def test_no_fd_budget_keeps_nothing_open(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        fs = FakeSysfs(str(tmp_path), nics=1, with_bond=False)
        c = RdmaSysfsCollector(str(tmp_path), budget=FileBudget(0, 0))
        nic_report(c)
        assert c._port_files and not any(k.fds for k in c._port_files.values())
        fs.set_port_down(0)
        assert nic_report(c).nics[0].state == "DOWN"
