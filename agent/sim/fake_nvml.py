"""A fake NVML with the same surface as ``pynvml``, plus fault injection.

The GPU collector takes its NVML as a parameter, so tests, the simulator and demo
clusters run the real collector against this object. Names, error classes and
constants are pynvml's own (imported from it: pynvml imports fine without a driver),
so ``except pynvml.NVMLError_GpuIsLost`` catches the fake's errors and the fake cannot
drift from the real bindings unnoticed (a test checks every name it exposes).

Behaviour matched to the real bindings: calls before ``nvmlInit`` raise
``NVMLError_Uninitialized``; init/shutdown are refcounted; ``nvmlEventSetWait`` blocks
up to its timeout and raises ``NVMLError_Timeout``; a lost GPU raises
``NVMLError_GpuIsLost`` from every call that touches it, including
``nvmlDeviceGetHandleByIndex``. Everything is deterministic for a given seed.
"""

from __future__ import annotations

import collections
import random
import struct
import threading
import time
import uuid as uuidlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml

# Bus numbers of the eight H100 SXM GPUs in a DGX/HGX H100 (nvidia-smi order).
H100_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
H100_MODEL = "NVIDIA H100 80GB HBM3"
H100_MEMORY_TOTAL = 85_520_809_984  # 81559 MiB, as nvidia-smi shows it
H100_NVLINKS = 18
H100_POWER_LIMIT_MW = 700_000
STALL_POWER_MW = 95_000  # an H100 spinning in a stuck NCCL kernel: ~idle power (soperator #796, ClusterMAX)
H100_SM_CLOCK_MAX_MHZ = 1980
H100_MEM_CLOCK_MHZ = 2619
H100_PCIE_WIDTH = 16  # H100 SXM5: PCIe Gen5 x16 to its host switch
H100_PCIE_GEN = 5

_NVLINK_COUNTERS = 5  # NVML_NVLINK_ERROR_DL_REPLAY .. NVML_NVLINK_ERROR_DL_ECC_DATA

# Bits set by inject_thermal_slowdown.
_THERMAL_BITS = pynvml.nvmlClocksEventReasonHwThermalSlowdown | pynvml.nvmlClocksEventReasonHwSlowdown

_SUPPORTED_EVENTS = (
    pynvml.nvmlEventTypeSingleBitEccError
    | pynvml.nvmlEventTypeDoubleBitEccError
    | pynvml.nvmlEventTypePState
    | pynvml.nvmlEventTypeXidCriticalError
    | pynvml.nvmlEventTypeClock
    | pynvml.nvmlEventTypeDramRetirementEvent
    | pynvml.nvmlEventTypeDramRetirementFailure
    | pynvml.nvmlEventTypeGpuRecoveryAction
)

# NVML's "no instance" value for gpuInstanceId / computeInstanceId outside MIG.
_NO_INSTANCE = 0xFFFFFFFF

# Field ids nvmlDeviceGetFieldValues answers, and the single-value function each mirrors:
# naming that function in ``unsupported`` makes its fields NOT_SUPPORTED too (one device
# capability, two ways to read it). Naming only the field id models an older driver that
# lacks the field but still answers the function.
_FIELD_FUNCTION: dict[int, str] = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: "nvmlDeviceGetTotalEccErrors",
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: "nvmlDeviceGetTotalEccErrors",
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: "nvmlDeviceGetTotalEccErrors",
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: "nvmlDeviceGetTotalEccErrors",
    pynvml.NVML_FI_DEV_RETIRED_SBE: "nvmlDeviceGetRetiredPages",
    pynvml.NVML_FI_DEV_RETIRED_DBE: "nvmlDeviceGetRetiredPages",
    pynvml.NVML_FI_DEV_RETIRED_PENDING: "nvmlDeviceGetRetiredPagesPendingStatus",
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: "nvmlDeviceGetPcieReplayCounter",
    pynvml.NVML_FI_DEV_REMAPPED_COR: "nvmlDeviceGetRemappedRows",
    pynvml.NVML_FI_DEV_REMAPPED_UNC: "nvmlDeviceGetRemappedRows",
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: "nvmlDeviceGetRemappedRows",
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: "nvmlDeviceGetRemappedRows",
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE: "nvmlDeviceGetNvLinkState",
}
_ECC_FIELDS = {
    pynvml.NVML_FI_DEV_ECC_SBE_VOL_TOTAL: (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC),
    pynvml.NVML_FI_DEV_ECC_DBE_VOL_TOTAL: (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC),
    pynvml.NVML_FI_DEV_ECC_SBE_AGG_TOTAL: (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC),
    pynvml.NVML_FI_DEV_ECC_DBE_AGG_TOTAL: (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC),
}
_UINT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
_ULL = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
# c_nvmlFieldValue_t as bytes: fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn,
# then the 8-byte value union (its members all start at its first byte).
_ROW = struct.Struct("=IIqqII8s")
_VALUE_PACK = {_UINT: struct.Struct("@I4x"), _ULL: struct.Struct("@Q"), 0: struct.Struct("@d")}
_NO_VALUE = bytes(8)


@dataclass(frozen=True)
class FakeHandle:
    """Opaque device handle; ``gpu`` is the physical slot, stable across enumeration changes."""

    gpu: int


@dataclass(frozen=True)
class FakePciInfo:
    """The fields of pynvml's ``nvmlPciInfo_t`` a caller reads (strings already decoded)."""

    busId: str
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int


@dataclass(frozen=True)
class FakeMemoryInfo:
    total: int
    free: int
    used: int


@dataclass(frozen=True)
class FakeUtilization:
    gpu: int
    memory: int


@dataclass
class FakeProcessInfo:
    """pynvml's friendly object for ``c_nvmlProcessInfo_v3_t``: pid, usedGpuMemory (None when NVML
    says NOT_AVAILABLE), gpuInstanceId and computeInstanceId (0xFFFFFFFF outside MIG)."""

    pid: int
    usedGpuMemory: int | None
    gpuInstanceId: int = _NO_INSTANCE
    computeInstanceId: int = _NO_INSTANCE


@dataclass(frozen=True)
class FakeEventData:
    """``c_nvmlEventData_t``."""

    device: FakeHandle
    eventType: int
    eventData: int
    gpuInstanceId: int = _NO_INSTANCE
    computeInstanceId: int = _NO_INSTANCE


@dataclass
class FakeEventSet:
    """An event set: per-GPU registered masks and a queue of pending events."""

    registrations: dict[int, int] = field(default_factory=dict)
    queue: collections.deque[FakeEventData] = field(default_factory=collections.deque)
    freed: bool = False


@dataclass
class SimGpu:
    """One simulated H100: identity, a load profile, and the fault state injected into it."""

    index: int
    uuid: str
    serial: str
    bus: int
    model: str = H100_MODEL
    vbios: str = "96.00.99.00.01"
    memory_total: int = H100_MEMORY_TOTAL
    nvlink_count: int = H100_NVLINKS
    # Load profile (a busy training job).
    base_temp_c: float = 62.0
    base_mem_temp_c: float = 72.0
    base_power_mw: float = 610_000.0
    base_util_pct: float = 97.0
    base_mem_util_pct: float = 38.0
    memory_used: int = 72 * 1024**3
    # Faults and counters.
    slow_factor: float = 1.0
    lost: bool = False
    reset_required: bool = False
    removed: bool = False
    thermal: bool = False
    clock_reasons: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (errType, counterType) -> count
    remap_corr: int = 0
    remap_unc: int = 0
    remap_pending: bool = False
    remap_failure: bool = False
    retired: dict[int, list[int]] = field(default_factory=dict)  # cause -> page addresses
    retired_pending: bool = False
    pcie_replay: int = 0
    pcie_width: int = H100_PCIE_WIDTH  # the link as trained now (a fault lowers it)
    pcie_gen: int = H100_PCIE_GEN
    nvlink_up: list[bool] = field(default_factory=list)
    nvlink_errors: list[list[int]] = field(default_factory=list)
    recovery_action: int = 0
    processes: list[tuple[int, int | None]] = field(default_factory=list)  # (pid, used bytes) computing on it
    collective_stall: bool = False  # kernels spinning in a stuck collective: busy, at idle power

    @classmethod
    def build(cls, index: int, seed: int, bus: int | None = None) -> SimGpu:
        """A healthy GPU whose identity and load profile depend only on (seed, index)."""
        rng = random.Random(f"starpulse-sim:{seed}:{index}")
        gpu_uuid = uuidlib.UUID(int=rng.getrandbits(128), version=4)
        serial = f"1654{rng.randrange(10**9):09d}"
        if bus is None:
            bus = H100_PCI_BUSES[index] if index < len(H100_PCI_BUSES) else (0x100 + index * 0x10) % 0xFF
        return cls(
            index=index,
            uuid=f"GPU-{gpu_uuid}",
            serial=serial,
            bus=bus,
            base_temp_c=rng.uniform(55.0, 68.0),
            base_mem_temp_c=rng.uniform(66.0, 78.0),
            base_power_mw=rng.uniform(560_000.0, 660_000.0),
            base_util_pct=rng.uniform(94.0, 99.5),
            base_mem_util_pct=rng.uniform(30.0, 45.0),
            memory_used=int(rng.uniform(0.80, 0.92) * H100_MEMORY_TOTAL),
            ecc={
                (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
                (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_VOLATILE_ECC): 0,
                (pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED, pynvml.NVML_AGGREGATE_ECC): 0,
                (pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, pynvml.NVML_AGGREGATE_ECC): 0,
            },
            retired={
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [],
                pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [],
            },
            nvlink_up=[True] * H100_NVLINKS,
            nvlink_errors=[[0] * _NVLINK_COUNTERS for _ in range(H100_NVLINKS)],
        )

    @property
    def pci_bus_id(self) -> str:
        return f"00000000:{self.bus:02X}:00.0"


_NOT_SUPPORTED = (pynvml.NVML_ERROR_NOT_SUPPORTED, 0, 0)


def _nvlink_state(gpu: SimGpu, scope: int) -> tuple[int, int, int]:
    if not 0 <= scope < pynvml.NVML_NVLINK_MAX_LINKS:
        return pynvml.NVML_ERROR_INVALID_ARGUMENT, 0, 0
    if scope >= gpu.nvlink_count:
        return _NOT_SUPPORTED
    state = pynvml.NVML_NVLINK_STATE_ACTIVE if gpu.nvlink_up[scope] else pynvml.NVML_NVLINK_STATE_INACTIVE
    return pynvml.NVML_SUCCESS, _UINT, state


def _ok(value_type: int, read: Any) -> Any:
    return lambda gpu, scope: (pynvml.NVML_SUCCESS, value_type, read(gpu))


_SBE_CAUSE = pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
_DBE_CAUSE = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR

# Field id -> (gpu, scopeId) -> (nvmlReturn, valueType, value); memory temperature draws noise
# and is computed in FakeNvml._field.
_FIELD_GETTERS: dict[int, Any] = {
    **{fid: _ok(_ULL, lambda g, key=key: g.ecc[key]) for fid, key in _ECC_FIELDS.items()},
    pynvml.NVML_FI_DEV_NVLINK_GET_STATE: _nvlink_state,
    pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: _ok(_UINT, lambda g: g.recovery_action),
    pynvml.NVML_FI_DEV_REMAPPED_COR: _ok(_UINT, lambda g: g.remap_corr),
    pynvml.NVML_FI_DEV_REMAPPED_UNC: _ok(_UINT, lambda g: g.remap_unc),
    pynvml.NVML_FI_DEV_REMAPPED_PENDING: _ok(_UINT, lambda g: int(g.remap_pending)),
    pynvml.NVML_FI_DEV_REMAPPED_FAILURE: _ok(_UINT, lambda g: int(g.remap_failure)),
    pynvml.NVML_FI_DEV_RETIRED_SBE: _ok(_UINT, lambda g: len(g.retired[_SBE_CAUSE])),
    pynvml.NVML_FI_DEV_RETIRED_DBE: _ok(_UINT, lambda g: len(g.retired[_DBE_CAUSE])),
    pynvml.NVML_FI_DEV_RETIRED_PENDING: _ok(_UINT, lambda g: int(g.retired_pending)),
    pynvml.NVML_FI_DEV_PCIE_REPLAY_COUNTER: _ok(_UINT, lambda g: g.pcie_replay),
}


def _error(code: int) -> pynvml.NVMLError:
    """The pynvml exception instance for an NVML return code."""
    return pynvml.NVMLError(code)


class FakeNvml:
    """pynvml look-alike over ``gpu_count`` simulated H100s, with fault injection.

    ``unsupported`` names pynvml functions (``"nvmlDeviceGetPowerUsage"``) that raise
    ``NVMLError_NotSupported`` on every GPU, and field ids (``82``) whose element in
    ``nvmlDeviceGetFieldValues`` comes back with ``NVML_ERROR_NOT_SUPPORTED``. A function
    named there also makes the field ids that mirror it NOT_SUPPORTED (the device lacks the
    value); a field id alone leaves the function working (a driver without that field id).
    """

    # Error classes and the code -> class map: pynvml's own objects.
    NVMLError = pynvml.NVMLError
    NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized
    NVMLError_InvalidArgument = pynvml.NVMLError_InvalidArgument
    NVMLError_NotSupported = pynvml.NVMLError_NotSupported
    NVMLError_NoPermission = pynvml.NVMLError_NoPermission
    NVMLError_NotFound = pynvml.NVMLError_NotFound
    NVMLError_DriverNotLoaded = pynvml.NVMLError_DriverNotLoaded
    NVMLError_Timeout = pynvml.NVMLError_Timeout
    NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
    NVMLError_FunctionNotFound = pynvml.NVMLError_FunctionNotFound
    NVMLError_GpuIsLost = pynvml.NVMLError_GpuIsLost
    NVMLError_ResetRequired = pynvml.NVMLError_ResetRequired
    NVMLError_LibRmVersionMismatch = pynvml.NVMLError_LibRmVersionMismatch
    NVMLError_Unknown = pynvml.NVMLError_Unknown
    nvmlExceptionClass = staticmethod(pynvml.nvmlExceptionClass)

    # Constants the collector uses.
    NVML_SUCCESS = pynvml.NVML_SUCCESS
    NVML_ERROR_NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED
    NVML_FEATURE_DISABLED = pynvml.NVML_FEATURE_DISABLED
    NVML_FEATURE_ENABLED = pynvml.NVML_FEATURE_ENABLED
    NVML_TEMPERATURE_GPU = pynvml.NVML_TEMPERATURE_GPU
    NVML_CLOCK_SM = pynvml.NVML_CLOCK_SM
    NVML_CLOCK_MEM = pynvml.NVML_CLOCK_MEM
    NVML_MEMORY_ERROR_TYPE_CORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    NVML_VOLATILE_ECC = pynvml.NVML_VOLATILE_ECC
    NVML_AGGREGATE_ECC = pynvml.NVML_AGGREGATE_ECC
    NVML_NVLINK_ERROR_DL_REPLAY = pynvml.NVML_NVLINK_ERROR_DL_REPLAY
    NVML_NVLINK_ERROR_DL_RECOVERY = pynvml.NVML_NVLINK_ERROR_DL_RECOVERY
    NVML_NVLINK_ERROR_DL_CRC_FLIT = pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT
    NVML_NVLINK_ERROR_DL_CRC_DATA = pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA
    NVML_NVLINK_ERROR_DL_ECC_DATA = pynvml.NVML_NVLINK_ERROR_DL_ECC_DATA
    NVML_NVLINK_MAX_LINKS = pynvml.NVML_NVLINK_MAX_LINKS
    NVML_FI_DEV_MEMORY_TEMP = pynvml.NVML_FI_DEV_MEMORY_TEMP
    NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = pynvml.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    NVML_VALUE_TYPE_DOUBLE = pynvml.NVML_VALUE_TYPE_DOUBLE
    NVML_VALUE_TYPE_UNSIGNED_INT = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
    NVML_VALUE_TYPE_UNSIGNED_LONG = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG
    NVML_VALUE_TYPE_SIGNED_INT = pynvml.NVML_VALUE_TYPE_SIGNED_INT
    NVML_VALUE_TYPE_UNSIGNED_SHORT = pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT
    NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS = (
        pynvml.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS
    )
    NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR = pynvml.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR

    nvmlEventTypeSingleBitEccError = pynvml.nvmlEventTypeSingleBitEccError
    nvmlEventTypeDoubleBitEccError = pynvml.nvmlEventTypeDoubleBitEccError
    nvmlEventTypePState = pynvml.nvmlEventTypePState
    nvmlEventTypeXidCriticalError = pynvml.nvmlEventTypeXidCriticalError
    nvmlEventTypeClock = pynvml.nvmlEventTypeClock
    nvmlEventTypeDramRetirementEvent = pynvml.nvmlEventTypeDramRetirementEvent
    nvmlEventTypeDramRetirementFailure = pynvml.nvmlEventTypeDramRetirementFailure
    nvmlEventTypeGpuRecoveryAction = pynvml.nvmlEventTypeGpuRecoveryAction
    nvmlEventTypeNone = pynvml.nvmlEventTypeNone
    nvmlEventTypeAll = pynvml.nvmlEventTypeAll

    nvmlClocksEventReasonGpuIdle = pynvml.nvmlClocksEventReasonGpuIdle
    nvmlClocksEventReasonSwPowerCap = pynvml.nvmlClocksEventReasonSwPowerCap
    nvmlClocksEventReasonHwSlowdown = pynvml.nvmlClocksEventReasonHwSlowdown
    nvmlClocksEventReasonSwThermalSlowdown = pynvml.nvmlClocksEventReasonSwThermalSlowdown
    nvmlClocksEventReasonHwThermalSlowdown = pynvml.nvmlClocksEventReasonHwThermalSlowdown
    nvmlClocksEventReasonHwPowerBrakeSlowdown = pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
    nvmlClocksEventReasonNone = pynvml.nvmlClocksEventReasonNone

    def __init__(
        self,
        gpu_count: int = 8,
        *,
        seed: int = 0,
        driver_missing: bool = False,
        unsupported: Iterable[str | int] = frozenset(),
        driver_version: str = "550.90.07",
        cuda_driver_version: int = 12040,
        pci_buses: Sequence[int] | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._rng = random.Random(seed)
        self._seed = seed
        if pci_buses is not None and len(pci_buses) < gpu_count:
            raise ValueError("pci_buses needs one bus number per GPU")
        # pci_buses lets a simulated node put its GPUs where its fake sysfs tree has them.
        self._buses = list(pci_buses) if pci_buses is not None else None
        self._gpus = [SimGpu.build(i, seed, self._bus(i)) for i in range(gpu_count)]
        self._driver_missing = driver_missing
        self._unsupported = frozenset(unsupported)
        self._unsupported_fields = frozenset(
            fid
            for fid in (*_FIELD_FUNCTION, *(u for u in self._unsupported if isinstance(u, int)))
            if fid in self._unsupported or _FIELD_FUNCTION.get(fid) in self._unsupported
        )
        self._driver_version = driver_version
        self._cuda_driver_version = cuda_driver_version
        self._refcount = 0
        self._event_sets: list[FakeEventSet] = []
        self.calls: collections.Counter[str] = collections.Counter()  # per function, for tests

    # ---- library lifecycle -------------------------------------------------------

    def _bus(self, index: int) -> int | None:
        return self._buses[index] if self._buses is not None else None

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        with self._lock:
            self.calls["nvmlInit"] += 1
            if self._driver_missing:
                raise _error(pynvml.NVML_ERROR_LIBRARY_NOT_FOUND)
            self._refcount += 1

    def nvmlShutdown(self) -> None:
        with self._lock:
            self._check_init("nvmlShutdown")
            self._refcount -= 1
            if self._refcount == 0:
                self._cond.notify_all()

    @property
    def initialized(self) -> bool:
        """True between a successful nvmlInit and its matching nvmlShutdown."""
        with self._lock:
            return self._refcount > 0

    # ---- system queries --------------------------------------------------------

    def nvmlSystemGetDriverVersion(self) -> str:
        with self._lock:
            self._check_init("nvmlSystemGetDriverVersion")
            return self._driver_version

    def nvmlSystemGetNVMLVersion(self) -> str:
        with self._lock:
            self._check_init("nvmlSystemGetNVMLVersion")
            return f"{self._cuda_driver_version // 1000}.{self._driver_version}"

    def nvmlSystemGetCudaDriverVersion(self) -> int:
        with self._lock:
            self._check_init("nvmlSystemGetCudaDriverVersion")
            return self._cuda_driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        with self._lock:
            self._check_init("nvmlSystemGetCudaDriverVersion_v2")
            return self._cuda_driver_version

    def nvmlDeviceGetCount(self) -> int:
        with self._lock:
            self._check_init("nvmlDeviceGetCount")
            return len(self._visible())

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        with self._lock:
            self._check_init("nvmlDeviceGetHandleByIndex")
            visible = self._visible()
            if not 0 <= index < len(visible):
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            gpu = visible[index]
            if gpu.lost:
                raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
            return FakeHandle(gpu.index)

    # ---- device identity ---------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetUUID", identity=True).uuid

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetName", identity=True).model

    def nvmlDeviceGetSerial(self, handle: FakeHandle) -> str:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetSerial", identity=True).serial

    def nvmlDeviceGetIndex(self, handle: FakeHandle) -> int:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetIndex", identity=True)
            return self._visible().index(gpu)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> FakePciInfo:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetPciInfo", identity=True)
            return FakePciInfo(
                busId=gpu.pci_bus_id,
                busIdLegacy=f"0000:{gpu.bus:02X}:00.0",
                domain=0,
                bus=gpu.bus,
                device=0,
                pciDeviceId=0x233010DE,  # H100 SXM5 80GB
                pciSubSystemId=0x16C110DE,
            )

    def nvmlDeviceGetVbiosVersion(self, handle: FakeHandle) -> str:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetVbiosVersion", identity=True).vbios

    # ---- device metrics --------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: FakeHandle, version: int | None = None) -> FakeMemoryInfo:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetMemoryInfo")
            return FakeMemoryInfo(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used, used=gpu.memory_used)

    def nvmlDeviceGetTemperature(self, handle: FakeHandle, sensor: int) -> int:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetTemperature")
            if sensor != pynvml.NVML_TEMPERATURE_GPU:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            temp = gpu.base_temp_c + self._noise(1.0) + (28.0 if gpu.thermal else 0.0)
            return round(temp)

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetPowerUsage")
            if gpu.collective_stall:
                return round(STALL_POWER_MW + self._noise(4_000.0))
            power = gpu.base_power_mw * gpu.slow_factor * (0.7 if gpu.thermal else 1.0)
            return max(70_000, round(power + self._noise(8_000.0)))

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        with self._lock:
            self._device(handle, "nvmlDeviceGetEnforcedPowerLimit")
            return H100_POWER_LIMIT_MW

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> FakeUtilization:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetUtilizationRates")
            util = 100.0 if gpu.collective_stall else gpu.base_util_pct * gpu.slow_factor + self._noise(0.5)
            mem = gpu.base_mem_util_pct * gpu.slow_factor + self._noise(1.0)
            return FakeUtilization(gpu=_clamp_pct(util), memory=_clamp_pct(mem))

    def nvmlDeviceGetComputeRunningProcesses(self, handle: FakeHandle) -> list[FakeProcessInfo]:
        """The compute processes on the GPU, as pynvml's (v3) call returns them."""
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetComputeRunningProcesses")
            return [FakeProcessInfo(pid, used) for pid, used in gpu.processes]

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetClockInfo")
            if clock_type == pynvml.NVML_CLOCK_MEM:
                return H100_MEM_CLOCK_MHZ
            if clock_type != pynvml.NVML_CLOCK_SM:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            clock = H100_SM_CLOCK_MAX_MHZ * gpu.slow_factor * (0.55 if gpu.thermal else 1.0)
            return max(345, round(clock - abs(self._noise(15.0))))

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_reasons

    def nvmlDeviceGetPerformanceState(self, handle: FakeHandle) -> int:
        with self._lock:
            self._device(handle, "nvmlDeviceGetPerformanceState")
            return 0

    def nvmlDeviceGetTotalEccErrors(self, handle: FakeHandle, error_type: int, counter_type: int) -> int:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetTotalEccErrors")
            try:
                return gpu.ecc[(error_type, counter_type)]
            except KeyError:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def nvmlDeviceGetRemappedRows(self, handle: FakeHandle) -> tuple[int, int, int, int]:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetRemappedRows")
            return (gpu.remap_corr, gpu.remap_unc, int(gpu.remap_pending), int(gpu.remap_failure))

    def nvmlDeviceGetRetiredPages(self, handle: FakeHandle, source_filter: int) -> list[int]:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetRetiredPages")
            try:
                return list(gpu.retired[source_filter])
            except KeyError:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: FakeHandle) -> int:
        with self._lock:
            return int(self._device(handle, "nvmlDeviceGetRetiredPagesPendingStatus").retired_pending)

    def nvmlDeviceGetPcieReplayCounter(self, handle: FakeHandle) -> int:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replay

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: FakeHandle) -> int:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: FakeHandle) -> int:
        with self._lock:
            self._device(handle, "nvmlDeviceGetMaxPcieLinkWidth")
            return H100_PCIE_WIDTH

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: FakeHandle) -> int:
        with self._lock:
            return self._device(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: FakeHandle) -> int:
        with self._lock:
            self._device(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
            return H100_PCIE_GEN

    def nvmlDeviceGetNvLinkState(self, handle: FakeHandle, link: int) -> int:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetNvLinkState")
            self._check_link(gpu, link)
            return pynvml.NVML_FEATURE_ENABLED if gpu.nvlink_up[link] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: FakeHandle, link: int, counter: int) -> int:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetNvLinkErrorCounter")
            self._check_link(gpu, link)
            if not 0 <= counter < _NVLINK_COUNTERS:
                raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return gpu.nvlink_errors[link][counter]

    def nvmlDeviceGetFieldValues(self, handle: FakeHandle, fieldIds: Sequence[Any]) -> Any:
        """A ctypes array of ``pynvml.c_nvmlFieldValue_t``, one per id, each with its own nvmlReturn.

        An id is a field id or a ``(fieldId, scopeId)`` pair (scopeId: the NVLink index for
        per-link fields), filled in exactly as pynvml fills them.
        """
        ids: list[tuple[int, int]] = []
        for fid in fieldIds:
            if isinstance(fid, int):  # pynvml: a bare id, or anything that unpacks to (id, scope)
                ids.append((fid, 0))
            else:
                field_id, scope = fid
                ids.append((field_id, scope))
        rows = bytearray()
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceGetFieldValues")
            now_us = int(time.time() * 1_000_000)
            for field_id, scope in ids:
                ret, value_type, value = self._field(gpu, field_id, scope)
                packed = _VALUE_PACK[value_type].pack(value) if ret == pynvml.NVML_SUCCESS else _NO_VALUE
                rows += _ROW.pack(field_id, scope, now_us, 0, value_type, ret, packed)
        # Built as bytes and copied in once: setting ctypes attributes one by one costs the
        # simulator more than the whole batched read costs the collector.
        return (pynvml.c_nvmlFieldValue_t * len(ids)).from_buffer_copy(rows)

    def _field(self, gpu: SimGpu, field_id: int, scope: int) -> tuple[int, int, int]:
        """(nvmlReturn, valueType, value) of one field of one GPU (lock held)."""
        if field_id in self._unsupported_fields:
            return _NOT_SUPPORTED
        getter = _FIELD_GETTERS.get(field_id)
        if getter is None:
            if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                temp = gpu.base_mem_temp_c + self._noise(1.0) + (20.0 if gpu.thermal else 0.0)
                return pynvml.NVML_SUCCESS, _UINT, round(temp)
            return _NOT_SUPPORTED
        return getter(gpu, scope)

    # ---- events ------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> FakeEventSet:
        with self._lock:
            self._check_init("nvmlEventSetCreate")
            es = FakeEventSet()
            self._event_sets.append(es)
            return es

    def nvmlDeviceGetSupportedEventTypes(self, handle: FakeHandle) -> int:
        with self._lock:
            self._device(handle, "nvmlDeviceGetSupportedEventTypes")
            return _SUPPORTED_EVENTS

    def nvmlDeviceRegisterEvents(self, handle: FakeHandle, event_types: int, event_set: FakeEventSet) -> None:
        with self._lock:
            gpu = self._device(handle, "nvmlDeviceRegisterEvents")
            self._check_event_set(event_set)
            if event_types & ~_SUPPORTED_EVENTS:
                raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)
            event_set.registrations[gpu.index] = event_set.registrations.get(gpu.index, 0) | event_types

    def nvmlEventSetWait(self, event_set: FakeEventSet, timeoutms: int) -> FakeEventData:
        """Next event; raises Timeout after ``timeoutms``, GpuIsLost when a registered GPU is lost."""
        deadline = time.monotonic() + max(0, timeoutms) / 1000.0
        with self._cond:
            while True:
                self._check_init("nvmlEventSetWait")
                self._check_event_set(event_set)
                if event_set.queue:
                    return event_set.queue.popleft()
                if any(self._gpus[i].lost for i in event_set.registrations):
                    raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise _error(pynvml.NVML_ERROR_TIMEOUT)
                self._cond.wait(remaining)

    def nvmlEventSetWait_v2(self, event_set: FakeEventSet, timeoutms: int) -> FakeEventData:
        return self.nvmlEventSetWait(event_set, timeoutms)

    def nvmlEventSetFree(self, event_set: FakeEventSet) -> None:
        with self._lock:
            self._check_init("nvmlEventSetFree")
            self._check_event_set(event_set)
            event_set.freed = True
            self._event_sets.remove(event_set)
            self._cond.notify_all()

    # ---- fault injection -------------------------------------------------------

    def gpu(self, index: int) -> SimGpu:
        """The simulated GPU in physical slot ``index`` (for assertions; do not mutate)."""
        return self._gpus[index]

    def inject_xid(self, index: int, xid: int) -> None:
        """Deliver an Xid critical-error event for the GPU."""
        with self._lock:
            self._post(index, pynvml.nvmlEventTypeXidCriticalError, xid)

    def inject_ecc_dbe(self, index: int) -> None:
        """An uncorrectable (double-bit) ECC error: counters +1, DBE event, a row remap pending."""
        with self._lock:
            gpu = self._gpus[index]
            for counter in (pynvml.NVML_VOLATILE_ECC, pynvml.NVML_AGGREGATE_ECC):
                gpu.ecc[(pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, counter)] += 1
            gpu.remap_unc += 1
            gpu.remap_pending = True
            self._post(index, pynvml.nvmlEventTypeDoubleBitEccError, 0)

    def inject_row_remap_failure(self, index: int) -> None:
        """Row remapping failed (no spare rows left): the GPU needs replacing."""
        with self._lock:
            self._gpus[index].remap_failure = True
            self._post(index, pynvml.nvmlEventTypeDramRetirementFailure, 0)

    def inject_gpu_lost(self, index: int) -> None:
        """The GPU fell off the bus: Xid 79, then every call for it raises GpuIsLost."""
        with self._lock:
            self._post(index, pynvml.nvmlEventTypeXidCriticalError, 79)
            self._gpus[index].lost = True

    def inject_reset_required(self, index: int) -> None:
        """Metric queries for the GPU raise ResetRequired (identity queries still work)."""
        with self._lock:
            self._gpus[index].reset_required = True

    def inject_nvlink_down(self, index: int, link: int = 0) -> None:
        """One NVLink goes down (after a recovery attempt, counted in DL_RECOVERY)."""
        with self._lock:
            gpu = self._gpus[index]
            gpu.nvlink_up[link] = False
            gpu.nvlink_errors[link][pynvml.NVML_NVLINK_ERROR_DL_RECOVERY] += 1

    def inject_thermal_slowdown(self, index: int) -> None:
        """Hardware thermal slowdown: HwThermalSlowdown | HwSlowdown set, SM clock drops, hotter."""
        with self._lock:
            gpu = self._gpus[index]
            gpu.thermal = True
            gpu.clock_reasons |= _THERMAL_BITS

    def set_pcie_link(self, index: int, width: int | None = None, gen: int | None = None) -> None:
        """The PCIe link trained narrower (lanes lost) and/or at a lower generation than the device's maximum."""
        with self._lock:
            gpu = self._gpus[index]
            if width is not None:
                gpu.pcie_width = width
            if gen is not None:
                gpu.pcie_gen = gen

    def set_slow(self, index: int, factor: float) -> None:
        """A fail-slow straggler: SM clock, power and utilization scaled by ``factor`` (0 < f <= 1)."""
        if not 0 < factor <= 1:
            raise ValueError(f"slow factor must be in (0, 1], got {factor}")
        with self._lock:
            self._gpus[index].slow_factor = factor

    def set_processes(self, index: int, processes: list[tuple[int, int | None]]) -> None:
        """The compute processes (pid, used bytes or None) running on GPU ``index`` from now on."""
        with self._lock:
            self._gpus[index].processes = list(processes)

    def set_collective_stall(self, index: int, on: bool) -> None:
        """A stuck collective: utilisation pinned at 100 %, power at idle level (``STALL_POWER_MW``)."""
        with self._lock:
            self._gpus[index].collective_stall = on

    def set_recovery_action(self, index: int, value: int) -> None:
        """Set NVML_FI_DEV_GET_GPU_RECOVERY_ACTION and deliver a GpuRecoveryAction event."""
        with self._lock:
            self._gpus[index].recovery_action = value
            self._post(index, pynvml.nvmlEventTypeGpuRecoveryAction, value)

    def remove_gpu(self, index: int) -> None:
        """The GPU disappears from enumeration (device count drops), as after a failed reset."""
        with self._lock:
            self._gpus[index].removed = True

    def clear(self, index: int) -> None:
        """Undo every fault on the GPU: back to the healthy state it was built in."""
        with self._lock:
            self._gpus[index] = SimGpu.build(index, self._seed, self._bus(index))
            self._cond.notify_all()

    # ---- internals (call with the lock held) -------------------------------------

    def _check_init(self, name: str) -> None:
        self.calls[name] += 1
        if self._refcount <= 0:
            raise _error(pynvml.NVML_ERROR_UNINITIALIZED)
        if name in self._unsupported:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _device(self, handle: FakeHandle, name: str, identity: bool = False) -> SimGpu:
        self._check_init(name)
        if not isinstance(handle, FakeHandle) or not 0 <= handle.gpu < len(self._gpus):
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self._gpus[handle.gpu]
        if gpu.lost:
            raise _error(pynvml.NVML_ERROR_GPU_IS_LOST)
        if gpu.removed:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if gpu.reset_required and not identity:
            raise _error(pynvml.NVML_ERROR_RESET_REQUIRED)
        return gpu

    @staticmethod
    def _check_link(gpu: SimGpu, link: int) -> None:
        if not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        if link >= gpu.nvlink_count:
            raise _error(pynvml.NVML_ERROR_NOT_SUPPORTED)

    def _check_event_set(self, event_set: FakeEventSet) -> None:
        if not isinstance(event_set, FakeEventSet) or event_set.freed:
            raise _error(pynvml.NVML_ERROR_INVALID_ARGUMENT)

    def _visible(self) -> list[SimGpu]:
        return [g for g in self._gpus if not g.removed]

    def _post(self, index: int, event_type: int, data: int) -> None:
        event = FakeEventData(device=FakeHandle(index), eventType=event_type, eventData=data)
        for es in self._event_sets:
            if es.registrations.get(index, 0) & event_type:
                es.queue.append(event)
        self._cond.notify_all()

    def _noise(self, scale: float) -> float:
        return self._rng.uniform(-scale, scale)


def _clamp_pct(value: float) -> int:
    return max(0, min(100, round(value)))


def fake_exports() -> dict[str, Any]:
    """Every pynvml-style public name FakeNvml exposes (for the surface test)."""
    return {name: getattr(FakeNvml, name) for name in dir(FakeNvml) if name.startswith(("nvml", "NVML"))}
