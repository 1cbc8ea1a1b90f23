"""The series of a GPU's sample, beside the NVML collector (``gpu``) that fills most of its fields.

Every accelerator backend reports a ``GpuSample``; this translates one, identity from the
inventory (``starpulse_gpu_info`` adds ``vendor`` and ``model``: join on it to select a
vendor's chips), NVML's own fields here and the vendor-neutral ones through
``accel.metrics.neutral``. Labels: ``node``, ``gpu`` (index), ``uuid`` and ``pci``.

ECC counts are counters (volatile ones reset on driver reload, which ``rate()`` and
``increase()`` take as a counter reset); remapped rows and retired pages only grow until
repaired and are gauges.
"""

from __future__ import annotations

from agent.collectors.accel.metrics import GPU_LABELS, neutral
from agent.collectors.exposition import Families
from starpulse.core import vocab
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

# nvmlClocksEventReason* bits (nvml.h), labelled as nvidia-smi names them.
CLOCK_EVENT_REASONS: dict[str, int] = {r.label: r.bit for r in vocab.CLOCK_EVENT_REASONS["nvidia"]}


def export(f: Families, node: str, report: tpb.Report, inventory: ipb.Inventory) -> None:
    """Every GPU of ``report``, named from ``inventory``."""
    gpu_info = {g.index: g for g in inventory.gpus}
    for gpu in report.gpus:
        _gpu(f, node, gpu, gpu_info.get(gpu.index))


def _gpu(f: Families, node: str, s: tpb.GpuSample, info: ipb.GpuInfo | None) -> None:
    lv = [node, str(s.index), s.uuid or (info.uuid if info else ""), info.pci_bus_id if info else ""]
    L = GPU_LABELS

    def opt(field: str, name: str, doc: str, scale: float = 1.0) -> None:
        if s.HasField(field):
            f.gauge(name, doc, L, lv, float(getattr(s, field)) * scale)

    def opt_counter(field: str, name: str, doc: str) -> None:
        if s.HasField(field):
            f.counter(name, doc, L, lv, float(getattr(s, field)))

    if info is not None:
        f.info(
            "starpulse_gpu",
            "GPU identity from the inventory (value 1).",
            {
                "node": lv[0],
                "gpu": lv[1],
                "uuid": lv[2],
                "pci": lv[3],
                "vendor": info.vendor or "nvidia",  # agents before issue 21 describe NVIDIA GPUs only
                "model": info.model,
                "serial": info.serial,
                "vbios_version": info.vbios_version,
            },
        )
    opt("temperature_c", "starpulse_gpu_temperature_celsius", "GPU core temperature.")
    opt("memory_temperature_c", "starpulse_gpu_memory_temperature_celsius", "GPU memory (HBM) temperature.")
    opt("power_w", "starpulse_gpu_power_watts", "GPU power draw.")
    opt("power_limit_w", "starpulse_gpu_power_limit_watts", "GPU enforced power limit.")
    opt(
        "utilization_gpu_pct",
        "starpulse_gpu_utilization_ratio",
        "Fraction of the last sample period a kernel was running (0-1).",
        0.01,
    )
    opt(
        "utilization_memory_pct",
        "starpulse_gpu_memory_utilization_ratio",
        "Fraction of the last sample period device memory was read or written (0-1).",
        0.01,
    )
    opt("memory_used_bytes", "starpulse_gpu_memory_used_bytes", "Device memory in use.")
    opt("memory_total_bytes", "starpulse_gpu_memory_total_bytes", "Device memory installed.")
    opt("sm_clock_mhz", "starpulse_gpu_sm_clock_hertz", "Current SM clock.", 1e6)
    opt("memory_clock_mhz", "starpulse_gpu_memory_clock_hertz", "Current memory clock.", 1e6)
    opt("performance_state", "starpulse_gpu_performance_state", "Current P-state (0 = maximum performance).")
    if s.HasField("clock_event_reasons"):
        for reason, bit in CLOCK_EVENT_REASONS.items():
            f.gauge(
                "starpulse_gpu_clock_event_reason",
                "1 while NVML reports this clocks-event (throttle) reason active.",
                (*L, "reason"),
                [*lv, reason],
                1 if s.clock_event_reasons & bit else 0,
            )
    # ECC counts: volatile resets on driver reload, aggregate persists in the InfoROM;
    # both are counters (rate()/increase() handle the reload reset).
    neutral(f, s, lv)
    opt_counter(
        "ecc_sbe_volatile",
        "starpulse_gpu_ecc_sbe_volatile_total",
        "Corrected (single-bit) ECC errors since the driver loaded.",
    )
    opt_counter(
        "ecc_dbe_volatile",
        "starpulse_gpu_ecc_dbe_volatile_total",
        "Uncorrected (double-bit) ECC errors since the driver loaded.",
    )
    opt_counter(
        "ecc_sbe_aggregate",
        "starpulse_gpu_ecc_sbe_aggregate_total",
        "Corrected (single-bit) ECC errors over the GPU's lifetime.",
    )
    opt_counter(
        "ecc_dbe_aggregate",
        "starpulse_gpu_ecc_dbe_aggregate_total",
        "Uncorrected (double-bit) ECC errors over the GPU's lifetime.",
    )
    for field, kind in (
        ("remapped_rows_correctable", "correctable"),
        ("remapped_rows_uncorrectable", "uncorrectable"),
    ):
        if s.HasField(field):
            f.gauge(
                "starpulse_gpu_remapped_rows",
                "Memory rows remapped, by the error class that caused it.",
                (*L, "cause"),
                [*lv, kind],
                getattr(s, field),
            )
    opt("remap_pending", "starpulse_gpu_row_remap_pending", "1 when a row remap waits for a GPU reset.")
    opt("remap_failure", "starpulse_gpu_row_remap_failure", "1 when a row remap failed (GPU needs service).")
    for field, kind in (("retired_pages_sbe", "sbe"), ("retired_pages_dbe", "dbe")):
        if s.HasField(field):
            f.gauge(
                "starpulse_gpu_retired_pages",
                "Memory pages retired (pre-Ampere page retirement), by cause.",
                (*L, "cause"),
                [*lv, kind],
                getattr(s, field),
            )
    opt("retired_pages_pending", "starpulse_gpu_retired_pages_pending", "1 when page retirement waits for a reboot.")
    opt_counter("pcie_replay_count", "starpulse_gpu_pcie_replay_total", "PCIe replays (link-level retransmits).")
    # The link as trained now and as built: a width or generation below its maximum is a
    # degraded link (the rule gpu.pcie_link_narrow); the current generation also drops when idle.
    opt("pcie_link_width", "starpulse_gpu_pcie_link_width", "PCIe lanes the link runs on now.")
    opt("pcie_link_width_max", "starpulse_gpu_pcie_link_width_max", "PCIe lanes the GPU and its slot support.")
    opt("pcie_link_gen", "starpulse_gpu_pcie_link_generation", "PCIe generation the link runs at now.")
    opt("pcie_link_gen_max", "starpulse_gpu_pcie_link_generation_max", "PCIe generation the GPU and its slot support.")
    for link in s.nvlinks:
        llv = [*lv, str(link.link)]
        f.gauge("starpulse_gpu_nvlink_up", "1 when the NVLink link is active.", (*L, "link"), llv, 1 if link.up else 0)
        for field in vocab.NVLINK_ERROR_COUNTERS:
            if link.HasField(field):
                f.counter(
                    "starpulse_gpu_nvlink_errors_total",
                    "NVLink error counters, by link and type.",
                    (*L, "link", "type"),
                    [*llv, field.removesuffix("_errors")],
                    getattr(link, field),
                )
    opt(
        "recovery_action",
        "starpulse_gpu_recovery_action",
        "NVML recommended recovery action (0 none, 1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and reset).",
    )
    f.gauge("starpulse_gpu_lost", "1 when NVML says the GPU is lost (fallen off the bus).", L, lv, 1 if s.lost else 0)
    f.gauge(
        "starpulse_gpu_reset_required",
        "1 when NVML says the GPU requires a reset.",
        L,
        lv,
        1 if s.reset_required else 0,
    )
