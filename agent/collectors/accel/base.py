"""What the agent needs from any accelerator, in one protocol.

A backend is a collector (``agent.collectors.base.Collector``) that also says whose chips it
reads. Its ``describe`` adds one ``GpuInfo`` per chip (index, serial or UUID, bus id, model,
``vendor``, ``interconnect``, ``link_count``); its ``collect`` one ``GpuSample`` per chip
(temperature, power, utilisation, memory, clocks, the vendor-neutral memory error counts and
RAS blocks, link state and errors, ``thermal_slowdown``); its findings carry the vendor's own
code (``Finding.vendor_code``) and a normalised action from ``starpulse.core.vocab.ACTIONS``.
``start_events`` starts whatever pushes findings between cycles (NVML's event thread); a
backend that has none does nothing there.

The NVIDIA collector (``agent.collectors.gpu.NvmlGpuCollector``) is one implementation,
AMD (``accel.amd``) and Ascend (``accel.ascend``) are others, and a plugin package adds its
own through the ``starpulse.accelerators`` entry point group (``accel.plugins``).
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from agent.collectors.base import Collector


class BackendUnavailable(RuntimeError):
    """The requested hardware backend cannot run here; the message is one line for the operator."""


@runtime_checkable
class AcceleratorBackend(Collector, Protocol):
    """An accelerator collector; ``vendor`` is what its GpuInfo and findings say."""

    vendor: str
    interconnect: str  # "nvlink", "xgmi", "hccs"; "" when the chips have no chip-to-chip links

    def start_events(self) -> object:
        """Start pushing findings between cycles (an event thread); a no-op where there is none."""
        ...
