"""Host facts and load: CPU, memory, load average, uptime, disk usage (via psutil).

A node that is swapping, full or pinned at 100% CPU slows a whole training job just
like a bad GPU does, so the controller needs these next to the GPU and NIC data.
Thresholds live in the controller; this collector only measures.
"""

from __future__ import annotations

import os
import platform
import socket
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import psutil
import structlog

from agent.collectors.procfs import ProcStats
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)


def read_os_release(path: str = "/etc/os-release") -> str:
    """PRETTY_NAME from os-release, "" when absent."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            for line in fh:
                key, sep, value = line.strip().partition("=")
                if sep and key == "PRETTY_NAME":
                    return value.strip().strip('"').strip("'")
    except OSError:
        pass
    return ""


class HostCollector:
    """psutil-backed host facts (inventory) and host sample (every report)."""

    name = "host"

    def __init__(
        self,
        mounts: Sequence[str] = ("/",),
        psutil_module: ModuleType | Any = psutil,
        os_release_path: str = "/etc/os-release",
    ) -> None:
        self.mounts = tuple(mounts)
        self._ps = psutil_module
        self._os_release = os_release_path
        self._missing: set[str] = set()
        self._boot_time: float | None = None
        # With the real psutil on Linux, CPU % and memory come from kept-open /proc files
        # (agent.collectors.procfs: psutil's arithmetic without its per-call parsing).
        self._proc = ProcStats.open() if psutil_module is psutil else None
        try:  # the first non-blocking call only primes the counters; it returns 0.0
            if self._proc is not None:
                self._proc.cpu_percent()
            else:
                self._ps.cpu_percent(interval=None)
        except Exception:
            log.debug("host_cpu_prime_failed")

    def supported(self) -> bool:
        """psutil works everywhere we run."""
        return True

    def describe(self, inventory: ipb.Inventory) -> None:
        """Hostname, kernel, OS, CPU count, memory; driver versions are the GPU collector's."""
        h = inventory.host
        h.hostname = socket.gethostname()
        h.kernel = platform.release()
        h.os = read_os_release(self._os_release)
        h.cpu_count = int(self._ps.cpu_count(logical=True) or os.cpu_count() or 0)
        h.memory_total_bytes = int(self._ps.virtual_memory().total)

    def collect(self, report: tpb.Report) -> list[Finding]:
        """Fill report.host; a mount that is gone is skipped (and logged once), not fatal."""
        s = report.host
        memory = None
        if self._proc is not None:
            try:
                s.cpu_percent = self._proc.cpu_percent()
                memory = self._proc.memory()
            except (OSError, ValueError, IndexError, KeyError) as e:
                log.warning("host_procfs_failed", error=str(e), fallback="psutil")
                self._proc.close()
                self._proc = None  # psutil from now on (its first CPU % is 0.0: not primed)
        if self._proc is None:
            s.cpu_percent = float(self._ps.cpu_percent(interval=None))
        if memory is None:
            vm = self._ps.virtual_memory()
            memory = int(vm.total), int(vm.available)
        s.memory_total_bytes, s.memory_available_bytes = memory
        try:
            s.load1, s.load5, s.load15 = (float(x) for x in self._ps.getloadavg())
        except (OSError, AttributeError):
            log.debug("host_loadavg_unavailable")
        if self._boot_time is None:  # fixed for the boot: read /proc/stat once, not every cycle
            try:
                self._boot_time = float(self._ps.boot_time())
            except Exception:
                log.debug("host_boot_time_unavailable")
        if self._boot_time is not None:
            s.uptime_s = max(0.0, time.time() - self._boot_time)
        for mount in self.mounts:
            try:
                du = self._ps.disk_usage(mount)
            except OSError as e:
                if mount not in self._missing:
                    self._missing.add(mount)
                    log.warning("host_mount_unavailable", mount=mount, error=str(e))
                continue
            self._missing.discard(mount)
            s.disks.add(mount=mount, total_bytes=int(du.total), used_bytes=int(du.used))
        return []

    def close(self) -> None:
        """Close the kept /proc files."""
        if self._proc is not None:
            self._proc.close()
            self._proc = None
