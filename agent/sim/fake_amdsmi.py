"""A fake ``amdsmi`` (AMD SMI's Python library) with the real module's surface, plus fault injection.

The real package (pinned in ``pyproject.toml``'s ``amd`` extra) loads ``libamd_smi.so`` when
it is imported, so without ROCm ``import amdsmi`` raises ``OSError`` or ``KeyError``, never
``ImportError``: it cannot be imported here, let alone called. This fake has the names the AMD
backend uses, with the real signatures' parameter names, the real enum values and the real
exception classes' names, codes and messages; ``tests/agent/sim/test_fake_amdsmi.py`` parses the
real package's source (downloaded, never imported) and fails when any of them drifts.

Behaviour matched to the real library: calls before ``amdsmi_init`` raise
``AmdSmiLibraryException`` with ``AMDSMI_STATUS_NOT_INIT``; a value the device does not report
is the string ``"N/A"`` (as the real ``_validate_if_max_uint`` returns it); a lost device
raises ``AMDSMI_STATUS_NOT_FOUND`` from every call that touches it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

# amdsmi_wrapper's status codes (the ones this fake raises or the backend sorts).
AMDSMI_STATUS_SUCCESS = 0
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_IO = 12
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NOT_INIT = 32
AMDSMI_STATUS_DRIVER_NOT_LOADED = 34

_ERR_INFO = {
    AMDSMI_STATUS_INVAL: "AMDSMI_STATUS_INVAL - Invalid parameters",
    AMDSMI_STATUS_NOT_SUPPORTED: "AMDSMI_STATUS_NOT_SUPPORTED - Feature not supported",
    AMDSMI_STATUS_IO: "AMDSMI_STATUS_IO - I/O Error",
    AMDSMI_STATUS_INIT_ERROR: "AMDSMI_STATUS_INIT_ERROR - Initialization error",
    AMDSMI_STATUS_NOT_FOUND: "AMDSMI_STATUS_NOT_FOUND - Device Not found",
    AMDSMI_STATUS_NOT_INIT: "AMDSMI_STATUS_NOT_INIT - Device not initialized",
    AMDSMI_STATUS_DRIVER_NOT_LOADED: "AMDSMI_STATUS_DRIVER_NOT_LOADED - Driver not loaded",
}

MI300X_MARKET_NAME = "AMD Instinct MI300X"
MI300X_VRAM_MB = 196_592  # amdsmi_get_gpu_vram_usage reports MB
MI300X_XGMI_LINKS = 7  # a fully connected 8-GPU hive: seven peers each
MI300X_POWER_LIMIT_W = 750
# Bus numbers of the eight MI300X OAMs of a typical 8-way platform (rocm-smi order).
MI300X_PCI_BUSES = (0x0C, 0x22, 0x38, 0x5C, 0x9F, 0xAF, 0xBF, 0xDF)


class AmdSmiException(Exception):
    """Base smi exception class"""


class AmdSmiLibraryException(AmdSmiException):
    """A non-success status from the library, as the real class carries it (``err_code``, ``err_info``)."""

    def __init__(self, err_code: int) -> None:
        err_code = abs(err_code)
        super().__init__(err_code)
        self.err_code = err_code
        self.err_info = _ERR_INFO.get(err_code, "AMDSMI_STATUS_UNKNOWN_ERROR - An unknown error occurred")

    def __str__(self) -> str:
        return f"Error code:\n\t{self.err_code} | {self.err_info}"

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiRetryException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(9)


class AmdSmiTimeoutException(AmdSmiLibraryException):
    def __init__(self) -> None:
        super().__init__(8)


class AmdSmiParameterException(AmdSmiException):
    # The real parameter names (receivedValue, expectedType), checked by the surface test.
    def __init__(self, receivedValue: Any, expectedType: Any, msg: str | None = None) -> None:
        super().__init__(msg)
        self.err_code = None
        self.err_msg = msg or f"Invalid parameter:\nActual type: {type(receivedValue)}\nExpected type: {expectedType}"

    def __str__(self) -> str:
        return self.err_msg


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 4294967295
    INIT_AMD_CPUS = 1
    INIT_AMD_GPUS = 2


class AmdSmiTemperatureType(IntEnum):
    EDGE = 0
    HOTSPOT = 1
    JUNCTION = 1
    VRAM = 2


class AmdSmiTemperatureMetric(IntEnum):
    CURRENT = 0


class AmdSmiClkType(IntEnum):
    SYS = 0
    GFX = 0
    MEM = 4


class AmdSmiGpuBlock(IntEnum):
    UMC = 1
    SDMA = 2
    GFX = 4
    MMHUB = 8
    PCIE_BIF = 32
    HDP = 64
    XGMI_WAFL = 128


# Annotations inside FakeAmdSmi, whose class attributes of the same names shadow the enums.
_AmdSmiGpuBlock = AmdSmiGpuBlock
_AmdSmiTemperatureType = AmdSmiTemperatureType
_AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
_AmdSmiClkType = AmdSmiClkType
_AmdSmiInitFlags = AmdSmiInitFlags


@dataclass(frozen=True)
class FakeProcessorHandle:
    """Stands for ``amdsmi_wrapper.amdsmi_processor_handle`` (a ctypes pointer in the real library)."""

    index: int


@dataclass
class FakeAmdGpu:
    """One simulated Instinct GPU: what it reports and the faults injected into it."""

    index: int
    bus: int
    temperature_c: int = 45
    hotspot_c: int = 55
    vram_c: int = 50
    power_w: int = 320
    gfx_activity: int = 80
    umc_activity: int = 40
    vram_used_mb: int = 64_000
    gfx_clk_mhz: int = 2100
    mem_clk_mhz: int = 1300
    ecc: dict[int, dict[str, int]] = field(default_factory=dict)  # block -> counts
    links_down: set[int] = field(default_factory=set)
    thermal: bool = False
    lost: bool = False
    unsupported: set[str] = field(default_factory=set)  # function names answering NOT_SUPPORTED

    @property
    def bdf(self) -> str:
        return f"0000:{self.bus:02x}:00.0"

    @property
    def uuid(self) -> str:
        return f"{self.index:02x}ff74a1-0000-1000-80ea-{self.bus:012x}"


class FakeAmdSmi:
    """The ``amdsmi`` module surface the AMD backend reads, over simulated GPUs."""

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiRetryException = AmdSmiRetryException
    AmdSmiTimeoutException = AmdSmiTimeoutException
    AmdSmiParameterException = AmdSmiParameterException
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiTemperatureType = AmdSmiTemperatureType
    AmdSmiTemperatureMetric = AmdSmiTemperatureMetric
    AmdSmiClkType = AmdSmiClkType
    AmdSmiGpuBlock = AmdSmiGpuBlock

    def __init__(
        self,
        gpu_count: int = 8,
        *,
        driver_missing: bool = False,
        driver_version: str = "6.10.5",
        pci_buses: list[int] | None = None,
    ) -> None:
        buses = pci_buses or [MI300X_PCI_BUSES[i % len(MI300X_PCI_BUSES)] + i // 8 for i in range(gpu_count)]
        self.gpus = [FakeAmdGpu(i, buses[i]) for i in range(gpu_count)]
        self.driver_missing = driver_missing
        self.driver_version = driver_version
        self._refs = 0

    # -- lifecycle ---------------------------------------------------------------------

    def amdsmi_init(self, flag: _AmdSmiInitFlags = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if self.driver_missing:
            raise AmdSmiLibraryException(AMDSMI_STATUS_DRIVER_NOT_LOADED)
        self._refs += 1

    def amdsmi_shut_down(self) -> None:
        if self._refs == 0:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        self._refs -= 1

    @property
    def initialized(self) -> bool:
        return self._refs > 0

    # -- fault injection ---------------------------------------------------------------

    def inject_ecc(self, index: int, block: _AmdSmiGpuBlock, *, uncorrectable: int = 1, correctable: int = 0) -> None:
        """Add RAS error counts to one block of one GPU (UMC: HBM, XGMI_WAFL: links)."""
        counts = self.gpus[index].ecc.setdefault(int(block), _zero_counts())
        counts["uncorrectable_count"] += uncorrectable
        counts["correctable_count"] += correctable

    def set_xgmi_link(self, index: int, link: int, up: bool) -> None:
        (self.gpus[index].links_down.discard if up else self.gpus[index].links_down.add)(link)

    def set_thermal(self, index: int, on: bool) -> None:
        self.gpus[index].thermal = on

    def lose(self, index: int, lost: bool = True) -> None:
        self.gpus[index].lost = lost

    def clear(self, index: int) -> None:
        """GPU ``index`` back as it was built (as a replaced board: no RAS counts, every link up)."""
        gpu = self.gpus[index]
        gpu.ecc.clear()
        gpu.links_down.clear()
        gpu.thermal = gpu.lost = False

    # -- reads -------------------------------------------------------------------------

    def _gpu(self, processor_handle: FakeProcessorHandle, fn: str) -> FakeAmdGpu:
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        if not isinstance(processor_handle, FakeProcessorHandle):
            raise AmdSmiParameterException(processor_handle, FakeProcessorHandle)
        gpu = self.gpus[processor_handle.index]
        if gpu.lost:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_FOUND)
        if fn in gpu.unsupported:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return gpu

    def amdsmi_get_processor_handles(self) -> list[FakeProcessorHandle]:
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_INIT)
        return [FakeProcessorHandle(g.index) for g in self.gpus]

    def amdsmi_get_gpu_device_bdf(self, processor_handle: FakeProcessorHandle) -> str:
        return self._gpu(processor_handle, "amdsmi_get_gpu_device_bdf").bdf

    def amdsmi_get_gpu_device_uuid(self, processor_handle: FakeProcessorHandle) -> str:
        return self._gpu(processor_handle, "amdsmi_get_gpu_device_uuid").uuid

    def amdsmi_get_gpu_asic_info(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_asic_info")
        return {
            "market_name": MI300X_MARKET_NAME,
            "vendor_id": "0x1002",
            "vendor_name": "Advanced Micro Devices Inc. [AMD/ATI]",
            "device_id": "0x74a1",
            "rev_id": "0x00",
            "asic_serial": f"0x{0xD2E1_0000 + gpu.index:016X}",
            "oam_id": gpu.index,
            "num_compute_units": 304,
            "target_graphics_version": "gfx942",
        }

    def amdsmi_get_gpu_board_info(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_board_info")
        return {
            "model_number": "102-G30211-0C",
            "product_serial": f"692251001{gpu.index:03d}",
            "fru_id": "N/A",
            "product_name": "AMD Instinct MI300X OAM",
            "manufacturer_name": "AMD",
        }

    def amdsmi_get_gpu_driver_info(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        self._gpu(processor_handle, "amdsmi_get_gpu_driver_info")
        return {"driver_name": "amdgpu", "driver_version": self.driver_version, "driver_date": "2015/01/01 00:00"}

    def amdsmi_get_gpu_vram_usage(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_vram_usage")
        return {"vram_total": MI300X_VRAM_MB, "vram_used": gpu.vram_used_mb}

    def amdsmi_get_gpu_activity(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_activity")
        return {"gfx_activity": gpu.gfx_activity, "umc_activity": gpu.umc_activity, "mm_activity": "N/A"}

    def amdsmi_get_power_info(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_power_info")
        return {
            "socket_power": gpu.power_w,
            "current_socket_power": gpu.power_w,
            "average_socket_power": "N/A",
            "gfx_voltage": "N/A",
            "soc_voltage": "N/A",
            "mem_voltage": "N/A",
            "power_limit": MI300X_POWER_LIMIT_W * 1_000_000,  # microwatts, as the library reports it
        }

    def amdsmi_get_temp_metric(
        self,
        processor_handle: FakeProcessorHandle,
        sensor_type: _AmdSmiTemperatureType,
        metric: _AmdSmiTemperatureMetric,
    ) -> int:
        gpu = self._gpu(processor_handle, "amdsmi_get_temp_metric")
        if sensor_type == AmdSmiTemperatureType.EDGE:
            # MI300X has no edge sensor: the library answers NOT_SUPPORTED (rocm-smi prints N/A).
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        hot = 100 if gpu.thermal else 0
        return (gpu.vram_c if sensor_type == AmdSmiTemperatureType.VRAM else gpu.hotspot_c) + hot

    def amdsmi_get_clock_info(
        self, processor_handle: FakeProcessorHandle, clock_type: _AmdSmiClkType
    ) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_clock_info")
        clk = gpu.mem_clk_mhz if clock_type == AmdSmiClkType.MEM else gpu.gfx_clk_mhz
        if gpu.thermal and clock_type != AmdSmiClkType.MEM:
            clk //= 2
        return {"clk": clk, "min_clk": 500, "max_clk": 2100, "clk_locked": False, "clk_deep_sleep": False}

    def amdsmi_get_violation_status(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_violation_status")
        hot = gpu.thermal
        return {
            "active_prochot_thrm": hot,
            "active_socket_thrm": hot,
            "active_vr_thrm": False,
            "active_hbm_thrm": False,
            "active_ppt_pwr": False,
        }

    def amdsmi_get_gpu_total_ecc_count(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_total_ecc_count")
        total = _zero_counts()
        for counts in gpu.ecc.values():
            for key, value in counts.items():
                total[key] += value
        return total

    def amdsmi_get_gpu_ecc_count(self, processor_handle: FakeProcessorHandle, block: _AmdSmiGpuBlock) -> dict[str, int]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_ecc_count")
        return dict(gpu.ecc.get(int(block), _zero_counts()))

    def amdsmi_get_gpu_xgmi_link_status(self, processor_handle: FakeProcessorHandle) -> dict[str, Any]:
        gpu = self._gpu(processor_handle, "amdsmi_get_gpu_xgmi_link_status")
        status = ["D" if link in gpu.links_down else "U" for link in range(MI300X_XGMI_LINKS)]
        return {"status": status, "total_links": MI300X_XGMI_LINKS}


def _zero_counts() -> dict[str, int]:
    return {"correctable_count": 0, "uncorrectable_count": 0, "deferred_count": 0}
