"""Which per-cycle GPU values come from one ``nvmlDeviceGetFieldValues`` call, and how to read them.

DCGM reads a GPU's values this way: one call per device returns many fields, each with its
own ``nvmlReturn``. The GPU collector used to make ~40 NVML calls per GPU per cycle; the
values listed here (ECC totals, row remapping, page retirement, PCIe replays, recovery
action, memory temperature, and each NVLink's state with ``scopeId`` = link) now come in
one. Only fields whose meaning is exactly that of the single-value call they replace are
listed (field id semantics from nvml.h / ``pynvml.py``):

- ECC totals 3-6 are ``nvmlDeviceGetTotalEccErrors(type, counter)``;
- REMAPPED_* 142-145 are the four members of ``nvmlDeviceGetRemappedRows``;
- RETIRED_SBE / _DBE 29-30 are the lengths of ``nvmlDeviceGetRetiredPages(cause)``,
  RETIRED_PENDING 31 is ``nvmlDeviceGetRetiredPagesPendingStatus``;
- PCIE_REPLAY_COUNTER 94 is ``nvmlDeviceGetPcieReplayCounter``;
- NVLINK_GET_STATE 165 (scope = link) answers NVML_NVLINK_STATE_*, not an enable state:
  ACTIVE is ``nvmlDeviceGetNvLinkState`` ENABLED and INACTIVE is DISABLED; any other
  state (SLEEP, ACTIVE_TRAFFIC_DISABLED, newer values) is asked with the single call.

Not batched, because no field means exactly the same: temperature, power (the fields are
explicit instant/average readings, ``nvmlDeviceGetPowerUsage`` is either, by architecture),
the enforced power limit, utilization, memory info, clocks, clock-event reasons, P-state,
and the per-link NVLink error counters (the per-link fields stop at link 11; an H100 has 18).
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pynvml

FI_MEMORY_TEMP = getattr(pynvml, "NVML_FI_DEV_MEMORY_TEMP", 82)
FI_RECOVERY_ACTION = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
FI_NVLINK_GET_STATE = getattr(pynvml, "NVML_FI_DEV_NVLINK_GET_STATE", 165)
NVLINK_STATE_INACTIVE = getattr(pynvml, "NVML_NVLINK_STATE_INACTIVE", 0)
NVLINK_STATE_ACTIVE = getattr(pynvml, "NVML_NVLINK_STATE_ACTIVE", 1)

# An element's nvmlReturn; what any other code means is nvml_errors.sort_code's to say.
SUCCESS = pynvml.NVML_SUCCESS

_VALUE_MEMBER = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
}


def field_value(fv: Any) -> float | int | None:
    """The value of one successful nvmlFieldValue_t element, picked by its valueType."""
    member = _VALUE_MEMBER.get(fv.valueType)
    if member is None:
        return None
    value: float | int = getattr(fv.value, member)
    return value


# The returned array is decoded with struct, one row at a time, where it has exactly the
# layout this was written for: pynvml's structures decode every attribute read in Python,
# several times the cost of the whole struct pass (30 elements per GPU per cycle).
_FV = pynvml.c_nvmlFieldValue_t
ROW = struct.Struct("=IIqqII8s")  # fieldId, scopeId, timestamp, latencyUsec, valueType, nvmlReturn, value
_LAYOUT = tuple((name, getattr(_FV, name).offset) for name, _ in _FV._fields_)
ROW_LAYOUT_OK = ctypes.sizeof(_FV) == ROW.size and _LAYOUT == (
    ("fieldId", 0),
    ("scopeId", 4),
    ("timestamp", 8),
    ("latencyUsec", 16),
    ("valueType", 24),
    ("nvmlReturn", 28),
    ("value", 32),
)
# The union's members all start at its first byte: unpack that member's C type from there.
# (Native formats: dVal double, uiVal unsigned int, ulVal unsigned long, ullVal unsigned
# long long, sllVal long long, siVal int, usVal unsigned short, as c_nvmlValue_t declares.)
VALUE_STRUCT = {
    pynvml.NVML_VALUE_TYPE_DOUBLE: struct.Struct("@d"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: struct.Struct("@I"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: struct.Struct("@L"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: struct.Struct("@Q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: struct.Struct("@q"),
    pynvml.NVML_VALUE_TYPE_SIGNED_INT: struct.Struct("@i"),
    pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: struct.Struct("@H"),
}


def decode(values: Any) -> list[tuple[int, float | int | None]]:
    """(nvmlReturn, value) per element of an nvmlDeviceGetFieldValues result; value None unless SUCCESS."""
    if ROW_LAYOUT_OK and isinstance(values, ctypes.Array) and values._type_ is _FV:
        out: list[tuple[int, float | int | None]] = []
        for _fid, _scope, _ts, _lat, vtype, ret, raw in ROW.iter_unpack(bytes(values)):
            unpack = VALUE_STRUCT.get(vtype)
            out.append((ret, unpack.unpack_from(raw)[0] if ret == SUCCESS and unpack is not None else None))
        return out
    return [(fv.nvmlReturn, field_value(fv) if fv.nvmlReturn == SUCCESS else None) for fv in values]


@dataclass(frozen=True)
class FieldGroup:
    """Sample attributes one single-value call fills, and the field ids that give the same values.

    A group is applied only when every one of its fields succeeded, as the single call
    either returns all of its values or none. ``single`` names the group's single-call
    reader in the collector; "" when there is none (the value exists only as a field).
    """

    name: str
    fields: tuple[tuple[int, str, Callable[[Any], Any]], ...]  # (field id, GpuSample attribute, type)
    single: str


def _fid(name: str, default: int) -> int:
    return int(getattr(pynvml, name, default))


GROUPS: tuple[FieldGroup, ...] = (
    FieldGroup("ecc_sbe_volatile", ((_fid("NVML_FI_DEV_ECC_SBE_VOL_TOTAL", 3), "ecc_sbe_volatile", int),), "ecc"),
    FieldGroup("ecc_dbe_volatile", ((_fid("NVML_FI_DEV_ECC_DBE_VOL_TOTAL", 4), "ecc_dbe_volatile", int),), "ecc"),
    FieldGroup("ecc_sbe_aggregate", ((_fid("NVML_FI_DEV_ECC_SBE_AGG_TOTAL", 5), "ecc_sbe_aggregate", int),), "ecc"),
    FieldGroup("ecc_dbe_aggregate", ((_fid("NVML_FI_DEV_ECC_DBE_AGG_TOTAL", 6), "ecc_dbe_aggregate", int),), "ecc"),
    FieldGroup(
        "remapped_rows",
        (
            (_fid("NVML_FI_DEV_REMAPPED_COR", 142), "remapped_rows_correctable", int),
            (_fid("NVML_FI_DEV_REMAPPED_UNC", 143), "remapped_rows_uncorrectable", int),
            (_fid("NVML_FI_DEV_REMAPPED_PENDING", 144), "remap_pending", bool),
            (_fid("NVML_FI_DEV_REMAPPED_FAILURE", 145), "remap_failure", bool),
        ),
        "remapped_rows",
    ),
    FieldGroup("retired_pages_sbe", ((_fid("NVML_FI_DEV_RETIRED_SBE", 29), "retired_pages_sbe", int),), "retired"),
    FieldGroup("retired_pages_dbe", ((_fid("NVML_FI_DEV_RETIRED_DBE", 30), "retired_pages_dbe", int),), "retired"),
    FieldGroup(
        "retired_pages_pending",
        ((_fid("NVML_FI_DEV_RETIRED_PENDING", 31), "retired_pages_pending", bool),),
        "retired_pending",
    ),
    FieldGroup("pcie_replay_count", ((_fid("NVML_FI_DEV_PCIE_REPLAY_COUNTER", 94), "pcie_replay_count", int),), "pcie"),
    FieldGroup("recovery_action", ((FI_RECOVERY_ACTION, "recovery_action", int),), ""),
    FieldGroup("memory_temperature_c", ((FI_MEMORY_TEMP, "memory_temperature_c", float),), ""),
)
