"""Host facts and host samples (psutil stubbed for determinism)."""

from __future__ import annotations

import socket
import time
from collections import namedtuple
from typing import Any

from agent.collectors.host import HostCollector, read_os_release
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

VM = namedtuple("VM", "total available")
DU = namedtuple("DU", "total used free percent")
GiB = 1 << 30


class FakePsutil:
    def __init__(self) -> None:
        self.cpu_calls: list[Any] = []

    def cpu_percent(self, interval: Any = None) -> float:
        self.cpu_calls.append(interval)
        return 37.5

    def cpu_count(self, logical: bool = True) -> int:
        return 192

    def virtual_memory(self) -> VM:
        return VM(total=2048 * GiB, available=1500 * GiB)

    def getloadavg(self) -> tuple[float, float, float]:
        return (12.0, 10.5, 9.25)

    def boot_time(self) -> float:
        return time.time() - 3600

    def disk_usage(self, path: str) -> DU:
        if path == "/gone":
            raise FileNotFoundError(2, "No such file or directory", path)
        return DU(total=100 * GiB, used=40 * GiB, free=60 * GiB, percent=40.0)


class TestHostCollector:
    def test_describe(self, tmp_path):
        """HostFacts carry hostname, kernel, OS PRETTY_NAME, CPU count and memory."""
        osr = tmp_path / "os-release"
        osr.write_text('NAME="Ubuntu"\nPRETTY_NAME="Ubuntu 22.04.4 LTS"\nID=ubuntu\n')
        c = HostCollector(psutil_module=FakePsutil(), os_release_path=str(osr))
        assert c.name == "host" and c.supported()
        inv = ipb.Inventory()
        c.describe(inv)
        assert inv.host.hostname == socket.gethostname()
        assert inv.host.kernel
        assert inv.host.os == "Ubuntu 22.04.4 LTS"
        assert (inv.host.cpu_count, inv.host.memory_total_bytes) == (192, 2048 * GiB)

    def test_collect(self):
        """HostSample has CPU (non-blocking), memory, load, uptime and disks; no findings."""
        ps = FakePsutil()
        c = HostCollector(mounts=("/", "/data"), psutil_module=ps)
        r = tpb.Report()
        assert c.collect(r) == []
        h = r.host
        assert h.cpu_percent == 37.5 and set(ps.cpu_calls) == {None}
        assert (h.memory_total_bytes, h.memory_available_bytes) == (2048 * GiB, 1500 * GiB)
        assert (h.load1, h.load5, h.load15) == (12.0, 10.5, 9.25)
        assert 3590 < h.uptime_s < 3700
        assert [(d.mount, d.total_bytes, d.used_bytes) for d in h.disks] == [
            ("/", 100 * GiB, 40 * GiB),
            ("/data", 100 * GiB, 40 * GiB),
        ]

    def test_missing_mount_is_skipped(self):
        """A mount that does not exist is skipped, the others are still reported."""
        c = HostCollector(mounts=("/gone", "/"), psutil_module=FakePsutil())
        r = tpb.Report()
        c.collect(r)
        c.collect(r := tpb.Report())
        assert [d.mount for d in r.host.disks] == ["/"]

    def test_real_psutil(self):
        """With the real psutil the sample is plausible."""
        c = HostCollector()
        r = tpb.Report()
        c.collect(r)
        assert r.host.memory_total_bytes > 0 and r.host.uptime_s > 0
        assert r.host.disks[0].mount == "/" and r.host.disks[0].total_bytes > 0

    def test_os_release_missing(self, tmp_path):
        """No os-release file means an empty OS name, not an error."""
        assert read_os_release(str(tmp_path / "nope")) == ""
