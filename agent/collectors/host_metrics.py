"""The series of the host's sample, beside the host collector (``host``) that reads it.

Labels: ``node``, and ``mount`` for a filesystem's size and use.
"""

from __future__ import annotations

from agent.collectors.exposition import Families
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb


def export(f: Families, node: str, report: tpb.Report, inventory: ipb.Inventory) -> None:
    """The host's load, memory, uptime and disks, when ``report`` has them."""
    if report.HasField("host"):
        _host(f, node, report.host)


def _host(f: Families, node: str, h: tpb.HostSample) -> None:
    L = ("node",)
    lv = [node]
    f.gauge(
        "starpulse_host_cpu_utilization_ratio",
        "CPU busy fraction over the last cycle (0-1).",
        L,
        lv,
        h.cpu_percent / 100,
    )
    f.gauge("starpulse_host_memory_total_bytes", "Physical memory installed.", L, lv, h.memory_total_bytes)
    f.gauge("starpulse_host_memory_available_bytes", "Memory available for new work.", L, lv, h.memory_available_bytes)
    f.gauge("starpulse_host_load1", "1-minute load average.", L, lv, h.load1)
    f.gauge("starpulse_host_load5", "5-minute load average.", L, lv, h.load5)
    f.gauge("starpulse_host_load15", "15-minute load average.", L, lv, h.load15)
    f.gauge("starpulse_host_uptime_seconds", "Time since boot.", L, lv, h.uptime_s)
    for d in h.disks:
        f.gauge(
            "starpulse_host_disk_total_bytes",
            "Size of the filesystem at the mount.",
            (*L, "mount"),
            [*lv, d.mount],
            d.total_bytes,
        )
        f.gauge(
            "starpulse_host_disk_used_bytes",
            "Bytes used on the filesystem at the mount.",
            (*L, "mount"),
            [*lv, d.mount],
            d.used_bytes,
        )
