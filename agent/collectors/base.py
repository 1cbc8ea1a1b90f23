"""The one small protocol every collector implements, and the sink for async findings.

A collector fills its part of the inventory once and its part of each report every
cycle. It returns findings for *changes* it saw (a link went down), including on its
first cycle any state that is already bad, so a one-shot scan sees it too. Raising is
allowed: the runner isolates each collector and records the error in the report.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

# Event-driven collectors (NVML event thread, kernel-log tail) push findings here.
# It must be thread-safe: the agent's implementation is.
FindingSink = Callable[[Finding], None]


class CollectorUnsupported(Exception):
    """This source does not exist on this host (no driver, no lldpd, no sysfs tree)."""


@runtime_checkable
class Collector(Protocol):
    """A telemetry source. ``name`` is unique in the agent's registry."""

    name: str

    def supported(self) -> bool:
        """True when the source exists here; an unsupported collector is skipped."""
        ...

    def describe(self, inventory: ipb.Inventory) -> None:
        """Fill this source's part of the inventory (GPUs, NICs, LLDP, host facts)."""
        ...

    def collect(self, report: tpb.Report) -> list[Finding]:
        """Fill this source's part of one report; return findings for changes seen."""
        ...

    def close(self) -> None:
        """Release handles and stop threads. Idempotent."""
        ...
