"""The series of the vendor-neutral sample fields (issue 21), beside the backends that fill them.

Any vendor's memory errors, interconnect links and thermal flag: AMD's and Ascend's
backends fill these fields, NVIDIA's its own (``agent.collectors.gpu_metrics``, which calls
``neutral`` for every GPU so each chip's series sit together).
"""

from __future__ import annotations

from agent.collectors.exposition import Families
from starpulse.v1 import telemetry_pb2 as tpb

GPU_LABELS = ("node", "gpu", "uuid", "pci")


def neutral(f: Families, s: tpb.GpuSample, lv: list[str]) -> None:
    """Any vendor's memory errors, interconnect links and thermal flag for one GPU labelled ``lv``."""
    L = GPU_LABELS
    if s.HasField("memory_errors_correctable"):
        f.counter(
            "starpulse_gpu_memory_errors_correctable_total",
            "Corrected memory errors, any vendor (AMD: RAS total).",
            L,
            lv,
            float(s.memory_errors_correctable),
        )
    if s.HasField("memory_errors_uncorrectable"):
        f.counter(
            "starpulse_gpu_memory_errors_uncorrectable_total",
            "Uncorrectable memory errors, any vendor (AMD: RAS total).",
            L,
            lv,
            float(s.memory_errors_uncorrectable),
        )
    if s.HasField("links_down"):
        doc = "Interconnect links down (AMD XGMI, Ascend HCCS)."
        f.gauge("starpulse_gpu_interconnect_links_down", doc, L, lv, float(s.links_down))
    if s.HasField("thermal_slowdown"):
        doc = "1 while the chip slows itself for heat (any vendor)."
        f.gauge("starpulse_gpu_thermal_slowdown", doc, L, lv, float(s.thermal_slowdown))
    for block in s.ras_blocks:
        f.counter(
            "starpulse_gpu_ras_uncorrectable_errors_total",
            "Uncorrectable errors per RAS block (AMD: UMC is the HBM, XGMI_WAFL the links).",
            (*L, "block"),
            (*lv, block.block),
            float(block.uncorrectable),
        )
