"""AMD Instinct GPUs through AMD SMI's Python library (``amdsmi``).

``smi`` is a seam like the NVIDIA collector's ``nvml``: the real module in production,
``agent.sim.fake_amdsmi.FakeAmdSmi`` in tests and the simulator. The real library loads
``libamd_smi.so`` when imported, so a host without ROCm fails at *import* with ``OSError`` or
``KeyError``; ``load_amdsmi`` turns every such failure into one line for the operator.

What is read per GPU and cycle: hotspot and HBM temperature, socket power and its limit, GFX
and UMC activity, VRAM use, GFX and memory clocks, the thermal violation flags (the hardware
slowing the chip for heat), RAS error counts per block (UMC is the HBM, XGMI_WAFL the links)
and the XGMI link states. A value the library calls ``N/A`` or NOT_SUPPORTED stays absent.
"""

from __future__ import annotations

import importlib
from typing import Any

import structlog

from agent.collectors.accel.base import BackendUnavailable
from agent.collectors.accel.watch import DeviceWatch
from agent.collectors.base import FindingSink
from starpulse.core import vocab
from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

VENDOR = "amd"
SOURCE = "amdsmi"
# The RAS blocks read every cycle, as amdsmi.AmdSmiGpuBlock names them.
RAS_BLOCKS = ("UMC", "XGMI_WAFL", "GFX", "SDMA", "MMHUB", "PCIE_BIF", "HDP")
# Violation flags that mean the hardware slows the chip for heat (power caps are normal).
THERMAL_VIOLATIONS = ("active_prochot_thrm", "active_socket_thrm", "active_vr_thrm", "active_hbm_thrm")
# Status codes that mean the device is gone (AMDSMI_STATUS_NOT_FOUND, _IO), not one unsupported read.
_LOST_CODES = frozenset({31, 12})
_NOT_SUPPORTED = 2


def load_amdsmi() -> Any:
    """The real amdsmi module, initialised for GPUs; BackendUnavailable with one clear line otherwise."""
    try:
        smi = importlib.import_module("amdsmi")
    except ImportError:
        raise BackendUnavailable("amdsmi is not installed (pip install 'starpulse[amd]')") from None
    except (OSError, KeyError) as exc:  # the library is there, libamd_smi.so (ROCm) is not
        raise BackendUnavailable(f"amdsmi cannot load libamd_smi.so: {exc} (is ROCm installed?)") from None
    reason = amdsmi_unavailable_reason(smi)
    if reason is not None:
        raise BackendUnavailable(reason)
    return smi


def amdsmi_unavailable_reason(smi: Any) -> str | None:
    """Why AMD SMI cannot be used here, as one line; None when it can. Leaves it shut down."""
    try:
        smi.amdsmi_init(smi.AmdSmiInitFlags.INIT_AMD_GPUS)
    except smi.AmdSmiException as exc:
        return f"AMD SMI unavailable: {_one_line(exc)} (is the amdgpu driver loaded?)"
    smi.amdsmi_shut_down()
    return None


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def _num(value: Any) -> float | None:
    """A reading, or None for the library's "N/A" (and anything else that is not a number)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class AmdGpuCollector:
    """Collector for AMD Instinct GPUs through amdsmi (name "gpu", vendor "amd")."""

    name = "gpu"
    vendor = VENDOR
    interconnect = "xgmi"
    tool = "amdsmi"  # what a "could not check" line names

    def __init__(self, smi: Any, sink: FindingSink | None = None) -> None:
        self._smi = smi
        self._sink = sink
        self._initialized = False
        self._handles: list[Any] = []
        self._pci: dict[int, str] = {}
        self._watch = DeviceWatch(VENDOR, SOURCE)
        self._warned: set[tuple[int, str]] = set()
        self.unavailable_reason = ""  # why supported() said no, in AMD SMI's own words

    # -- Collector ---------------------------------------------------------------------

    def supported(self) -> bool:
        if not self._initialized:
            reason = amdsmi_unavailable_reason(self._smi)
            if reason is not None:
                self.unavailable_reason = reason
                return False
            self._smi.amdsmi_init(self._smi.AmdSmiInitFlags.INIT_AMD_GPUS)
            self._initialized = True
            self._handles = list(self._smi.amdsmi_get_processor_handles())
        return True

    def start_events(self) -> None:
        """AMD SMI's event reader needs the KFD; faults come from samples and the kernel log instead."""

    def describe(self, inventory: ipb.Inventory) -> None:
        smi = self._smi
        for index, handle in enumerate(self._handles):
            info = inventory.gpus.add(index=index, vendor=VENDOR, interconnect=self.interconnect)
            bdf = self._read(index, smi.amdsmi_get_gpu_device_bdf, handle)
            if isinstance(bdf, str):
                info.pci_bus_id = bdf
                self._pci[index] = vocab.canonical_pci(bdf)
            info.uuid = self._read(index, smi.amdsmi_get_gpu_device_uuid, handle) or ""
            asic = self._read(index, smi.amdsmi_get_gpu_asic_info, handle) or {}
            board = self._read(index, smi.amdsmi_get_gpu_board_info, handle) or {}
            info.model = str(asic.get("market_name") or board.get("product_name") or "")
            serial = board.get("product_serial") or asic.get("asic_serial")
            info.serial = str(serial) if serial not in (None, "N/A") else ""
            vram = self._read(index, smi.amdsmi_get_gpu_vram_usage, handle) or {}
            total = _num(vram.get("vram_total"))
            if total is not None:
                info.memory_total_bytes = int(total) * 1024 * 1024
            links = self._read(index, smi.amdsmi_get_gpu_xgmi_link_status, handle) or {}
            info.link_count = int(links.get("total_links") or 0)
            if index == 0:
                driver = self._read(index, smi.amdsmi_get_gpu_driver_info, handle) or {}
                inventory.host.driver_version = str(driver.get("driver_version", ""))

    def collect(self, report: tpb.Report) -> list[Finding]:
        out: list[Finding] = []
        for index, handle in enumerate(self._handles):
            gpu = report.gpus.add(index=index)
            self._sample(index, handle, gpu)
            out.extend(self._watch.judge(gpu, self._pci.get(index, "")))
        return out

    def close(self) -> None:
        if self._initialized:
            self._initialized = False
            try:
                self._smi.amdsmi_shut_down()
            except self._smi.AmdSmiException as exc:
                log.warning("amdsmi_shutdown_failed", error=_one_line(exc))

    # -- reading -----------------------------------------------------------------------

    def _read(self, index: int, fn: Any, *args: Any, lost: list[bool] | None = None) -> Any:
        """``fn(*args)``, or None when the value is absent; a lost device is flagged in ``lost``."""
        try:
            return fn(*args)
        except self._smi.AmdSmiLibraryException as exc:
            if exc.err_code in _LOST_CODES and lost is not None:
                lost.append(True)
            elif exc.err_code != _NOT_SUPPORTED and (index, fn.__name__) not in self._warned:
                self._warned.add((index, fn.__name__))
                log.warning("amdsmi_read_failed", gpu=index, call=fn.__name__, error=_one_line(exc))
        return None

    def _sample(self, index: int, handle: Any, gpu: tpb.GpuSample) -> None:  # noqa: C901
        # One straight line of reads, each value optional: splitting it would only scatter
        # the "absent when N/A" checks, which are what makes its branch count.
        smi = self._smi
        lost: list[bool] = []
        uuid = self._read(index, smi.amdsmi_get_gpu_device_uuid, handle, lost=lost)
        if lost:
            gpu.lost = True
            return
        gpu.uuid = uuid or ""
        if index not in self._pci and isinstance(bdf := self._read(index, smi.amdsmi_get_gpu_device_bdf, handle), str):
            self._pci[index] = vocab.canonical_pci(bdf)
        temp = smi.AmdSmiTemperatureType
        current = smi.AmdSmiTemperatureMetric.CURRENT
        hotspot = _num(self._read(index, smi.amdsmi_get_temp_metric, handle, temp.HOTSPOT, current))
        if hotspot is not None:
            gpu.temperature_c = hotspot
        hbm = _num(self._read(index, smi.amdsmi_get_temp_metric, handle, temp.VRAM, current))
        if hbm is not None:
            gpu.memory_temperature_c = hbm
        power = self._read(index, smi.amdsmi_get_power_info, handle) or {}
        watts = _num(power.get("current_socket_power"))
        if watts is None:
            watts = _num(power.get("socket_power"))
        if watts is not None:
            gpu.power_w = watts
        limit = _num(power.get("power_limit"))
        if limit:
            gpu.power_limit_w = limit / 1_000_000
        activity = self._read(index, smi.amdsmi_get_gpu_activity, handle) or {}
        if (gfx := _num(activity.get("gfx_activity"))) is not None:
            gpu.utilization_gpu_pct = gfx
        if (umc := _num(activity.get("umc_activity"))) is not None:
            gpu.utilization_memory_pct = umc
        vram = self._read(index, smi.amdsmi_get_gpu_vram_usage, handle) or {}
        if (used := _num(vram.get("vram_used"))) is not None:
            gpu.memory_used_bytes = int(used) * 1024 * 1024
        if (total := _num(vram.get("vram_total"))) is not None:
            gpu.memory_total_bytes = int(total) * 1024 * 1024
        for clk_type, attr in ((smi.AmdSmiClkType.GFX, "sm_clock_mhz"), (smi.AmdSmiClkType.MEM, "memory_clock_mhz")):
            clk = _num((self._read(index, smi.amdsmi_get_clock_info, handle, clk_type) or {}).get("clk"))
            if clk is not None:
                setattr(gpu, attr, int(clk))
        violation = self._read(index, smi.amdsmi_get_violation_status, handle)
        if isinstance(violation, dict):
            gpu.thermal_slowdown = any(violation.get(k) is True for k in THERMAL_VIOLATIONS)
        self._ras(index, handle, gpu)
        links = self._read(index, smi.amdsmi_get_gpu_xgmi_link_status, handle)
        if isinstance(links, dict):
            for link, state in enumerate(links.get("status") or ()):
                if state in ("U", "D"):  # "X": disabled by design, "N/A": unknown
                    gpu.links.add(link=link, up=state == "U")
            gpu.links_down = sum(not link.up for link in gpu.links)

    def _ras(self, index: int, handle: Any, gpu: tpb.GpuSample) -> None:
        smi = self._smi
        total = self._read(index, smi.amdsmi_get_gpu_total_ecc_count, handle)
        if isinstance(total, dict):
            if (ce := _num(total.get("correctable_count"))) is not None:
                gpu.memory_errors_correctable = int(ce)
            if (ue := _num(total.get("uncorrectable_count"))) is not None:
                gpu.memory_errors_uncorrectable = int(ue)
        for block in RAS_BLOCKS:
            counts = self._read(index, smi.amdsmi_get_gpu_ecc_count, handle, smi.AmdSmiGpuBlock[block])
            if not isinstance(counts, dict):
                continue
            gpu.ras_blocks.add(
                block=block,
                correctable=int(_num(counts.get("correctable_count")) or 0),
                uncorrectable=int(_num(counts.get("uncorrectable_count")) or 0),
                deferred=int(_num(counts.get("deferred_count")) or 0),
            )
