"""CPU % and memory from kept-open /proc files: the same numbers psutil gives for the same files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import psutil
import pytest

from agent.collectors.host import HostCollector
from agent.collectors.procfs import ProcStats
from starpulse.v1 import telemetry_pb2 as tpb

MEMINFO = (
    "MemTotal:       {total} kB\nMemFree:         1000000 kB\n{avail}Buffers:          200000 kB\n"
    "Cached:          3000000 kB\nActive:          4000000 kB\nInactive:        2000000 kB\nShmem:  100 kB\n"
)


def write_stat(root: Path, cpu: tuple[int, ...]) -> None:
    lines = ["cpu  " + " ".join(map(str, cpu)), "cpu0 " + " ".join(map(str, cpu)), "intr 1 2 3", "ctxt 99"]
    (root / "stat").write_text("\n".join(lines) + "\n")


def write_meminfo(root: Path, total: int, avail: int | None) -> None:
    line = "" if avail is None else f"MemAvailable:   {avail} kB\n"
    (root / "meminfo").write_text(MEMINFO.format(total=total, avail=line))


@pytest.fixture
def procfs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fake /proc that psutil reads too (PROCFS_PATH), with psutil's CPU % history cleared."""
    monkeypatch.setattr(psutil, "PROCFS_PATH", str(tmp_path))
    monkeypatch.setattr(psutil, "_last_cpu_times", {})
    write_stat(tmp_path, (100, 5, 50, 1000, 10, 1, 2, 0, 0, 0))
    write_meminfo(tmp_path, 16_000_000, 9_000_000)
    return tmp_path


class TestSameAsPsutil:
    def test_cpu_percent_through_guest_time_backwards_counters_and_no_time(self, procfs: Path) -> None:
        stats = ProcStats.open(str(procfs))
        assert stats is not None
        try:
            assert stats.cpu_percent() == 0.0  # primes, as psutil's first call does
            psutil.cpu_percent(interval=None)
            steps = [
                (180, 9, 77, 1400, 13, 2, 3, 0, 0, 0),
                (181, 9, 78, 1900, 13, 2, 3, 0, 0, 0),  # nearly idle
                (400, 30, 90, 1950, 70, 9, 9, 5, 120, 7),  # guest time (already in user / nice), steal
                (390, 30, 95, 2000, 60, 9, 9, 5, 120, 7),  # counters going backwards count as 0
                (390, 30, 95, 2000, 60, 9, 9, 5, 120, 7),  # no time passed: 0.0, not a division error
            ]
            for cpu in steps:
                write_stat(procfs, cpu)
                ours = stats.cpu_percent()
                assert ours == psutil.cpu_percent(interval=None)
            assert ours == 0.0
        finally:
            stats.close()

    def test_memory_total_and_available(self, procfs: Path) -> None:
        stats = ProcStats.open(str(procfs))
        assert stats is not None
        try:
            vm = psutil.virtual_memory()
            assert stats.memory() == (vm.total, vm.available) == (16_000_000 * 1024, 9_000_000 * 1024)
            write_meminfo(procfs, 16_000_000, 0)  # psutil estimates it then: left to psutil
            assert stats.memory() is None
            write_meminfo(procfs, 16_000_000, None)  # a kernel before 3.14
            assert stats.memory() is None
        finally:
            stats.close()

    def test_unusable_procfs_is_none(self, tmp_path: Path) -> None:
        assert ProcStats.open(str(tmp_path)) is None  # no files
        (tmp_path / "stat").write_text("garbage\n")
        write_meminfo(tmp_path, 1, 1)
        assert ProcStats.open(str(tmp_path)) is None


class TestHostCollectorUsesIt:
    def test_real_psutil_reads_kept_proc_files_and_close_releases_them(self) -> None:
        fds = len(os.listdir("/proc/self/fd"))
        c = HostCollector()
        assert c._proc is not None
        r = tpb.Report()
        c.collect(r)
        assert 0.0 <= r.host.cpu_percent <= 100.0
        assert 0 < r.host.memory_available_bytes <= r.host.memory_total_bytes == psutil.virtual_memory().total
        c.close()
        assert len(os.listdir("/proc/self/fd")) == fds

    def test_failing_read_falls_back_to_psutil(self, monkeypatch: pytest.MonkeyPatch) -> None:
        c = HostCollector()
        assert c._proc is not None

        def broken() -> Any:
            raise OSError(5, "Input/output error")

        monkeypatch.setattr(c._proc, "cpu_percent", broken)
        r = tpb.Report()
        c.collect(r)
        assert c._proc is None
        assert r.host.memory_total_bytes == psutil.virtual_memory().total
        c.collect(tpb.Report())
