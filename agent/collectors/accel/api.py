"""What an out-of-tree accelerator backend may import from starpulse: this module, and only it.

A plugin package declares an entry point in the ``starpulse.accelerators`` group whose object
is a callable ``make(sink) -> AcceleratorBackend`` (``sink`` takes findings between cycles; it
may be None). Its collector fills ``GpuInfo`` (index, uuid or serial, pci_bus_id, model,
``vendor``, ``interconnect``, ``link_count``) and ``GpuSample`` (the readings it has; what it
lacks stays unset) and returns ``Finding``s. ``DeviceWatch`` turns the vendor-neutral sample
fields into the shared findings (uncorrectable memory errors, a lost device); a vendor's own
fault is ``DeviceWatch.finding("accel_fault", index, action, message, code=...)`` with an
action from ``ACTIONS``. Raising ``BackendUnavailable`` with one line says the hardware or its
library is not there. ``examples/acme-accelerator`` is a complete plugin.
"""

from __future__ import annotations

from agent.collectors.accel.base import AcceleratorBackend, BackendUnavailable
from agent.collectors.accel.registry import ENTRY_POINT_GROUP
from agent.collectors.accel.watch import DeviceWatch
from agent.collectors.base import FindingSink
from starpulse.core.findings import Finding
from starpulse.core.vocab import ACTIONS
from starpulse.v1 import inventory_pb2, telemetry_pb2

__all__ = [
    "ACTIONS",
    "ENTRY_POINT_GROUP",
    "AcceleratorBackend",
    "BackendUnavailable",
    "DeviceWatch",
    "Finding",
    "FindingSink",
    "inventory_pb2",
    "telemetry_pb2",
]
