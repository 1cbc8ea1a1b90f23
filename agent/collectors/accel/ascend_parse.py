"""Parsers for what Huawei's ``npu-smi`` prints on an Ascend node.

``npu-smi info`` draws a table with two rows per chip: the first ``| NPU Name | Health |
Power(W) Temp(C) Hugepages |``, the second ``| Chip [Phy-ID] | Bus-Id | AICore(%)
Memory-Usage(MB) HBM-Usage(MB) |``. An Atlas A3 node prints two chips per NPU, the second
with ``-`` for power (the NPU's power is on its first chip). A process table follows; it is
skipped. ``npu-smi info -t health -i N -c C`` prints ``Health Status``, ``Error Code`` (several
codes, space separated, or ``NA``) and ``Error Information`` continued on later lines.
``npu-smi info -t hccs -i N -c C`` prints ``hccs <what> : value`` lines, the per-link ones as
bracketed lists with one entry per HCCS link (``hccs link lane list : [1111 1111 …]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

# npu-smi's health words (Huawei: OK normal, Warning minor alarm, Alarm major alarm, Critical
# critical alarm, UNKNOWN the device does not exist or has not started), as our grades. A major
# alarm can interrupt service, so Alarm is critical here, as Critical is.
HEALTH_GRADES = {"ok": "ok", "warning": "warning", "alarm": "critical", "critical": "critical"}

_FIRST = re.compile(r"^\|\s*(\d+)\s+(\S+)\s*\|\s*(\w+)\s*\|\s*(\S+)\s+(\S+)\s+(\d+)\s*/\s*(\d+)\s*\|$")
_SECOND = re.compile(
    r"^\|\s*(\d+)(?:\s+(\d+))?\s*\|\s*([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*\|"
    r"\s*(\S+)\s+(\d+)\s*/\s*(\d+)\s+(\d+)\s*/\s*(\d+)\s*\|$"
)
_CODE = re.compile(r"^[0-9A-Fa-f]{8}$")


@dataclass
class NpuChip:
    """One chip of ``npu-smi info``; a reading npu-smi prints as ``-`` is None."""

    npu_id: int
    chip_id: int
    model: str
    health_raw: str
    bus_id: str = ""
    phy_id: int | None = None
    power_w: float | None = None
    temperature_c: float | None = None
    aicore_pct: float | None = None
    memory_used_mb: int = 0
    memory_total_mb: int = 0
    hbm_used_mb: int = 0
    hbm_total_mb: int = 0

    @property
    def health(self) -> str:
        return health_grade(self.health_raw)


@dataclass
class NpuHealth:
    """``npu-smi info -t health``: the status word, the DCMI error codes and their text."""

    health_raw: str
    error_codes: list[str] = field(default_factory=list)
    error_information: list[str] = field(default_factory=list)

    @property
    def health(self) -> str:
        return health_grade(self.health_raw)


def health_grade(raw: str) -> str:
    """``ok``, ``warning``, ``critical`` or ``unknown`` for npu-smi's health word."""
    return HEALTH_GRADES.get(raw.strip().lower(), "unknown")


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None  # "-" or "NA": not reported


def parse_npu_smi_info(text: str) -> list[NpuChip]:
    """Every chip of an ``npu-smi info`` table, in the order printed (the process table is ignored)."""
    chips: list[NpuChip] = []
    pending: NpuChip | None = None
    for raw in text.splitlines():
        line = raw.strip()
        if (m := _FIRST.match(line)) is not None:
            npu, model, health, power, temp = m.group(1, 2, 3, 4, 5)
            pending = NpuChip(int(npu), -1, model, health, power_w=_number(power), temperature_c=_number(temp))
        elif pending is not None and (m := _SECOND.match(line)) is not None:
            chip, phy, bus, aicore, mem_used, mem_total, hbm_used, hbm_total = m.groups()
            pending.chip_id = int(chip)
            pending.phy_id = int(phy) if phy is not None else None
            pending.bus_id = bus
            pending.aicore_pct = _number(aicore)
            pending.memory_used_mb, pending.memory_total_mb = int(mem_used), int(mem_total)
            pending.hbm_used_mb, pending.hbm_total_mb = int(hbm_used), int(hbm_total)
            chips.append(pending)
            pending = None
        elif line.startswith("| NPU") and "Process id" in line:
            break
    return chips


def parse_npu_health(text: str) -> NpuHealth:
    """``npu-smi info -t health`` of one chip."""
    health = NpuHealth("UNKNOWN")
    in_info = False
    for raw in text.splitlines():
        key, sep, value = raw.partition(":")
        if not sep:
            continue
        key, value = key.strip(), value.strip()
        if key == "Health Status":
            health.health_raw, in_info = value, False
        elif key == "Error Code":
            health.error_codes = [c.upper() for c in value.split() if _CODE.match(c)]
            in_info = False
        elif key == "Error Information":
            in_info = True
            if value and value != "NA":
                health.error_information.append(value)
        elif key == "" and in_info and value:
            health.error_information.append(value)
    return health


@dataclass
class HccsLink:
    """One HCCS link of a chip, as position i of ``npu-smi info -t hccs``'s bracketed lists."""

    link: int
    lanes: str  # "1111": one digit per lane, 1 active
    errors: int | None = None
    retries: int | None = None

    @property
    def up(self) -> bool:
        # A link missing a lane runs at a fraction of its bandwidth and stalls every collective
        # that spans it: it counts as down, as npu-smi's health turns NOK with it.
        return bool(self.lanes) and set(self.lanes) == {"1"}


@dataclass
class HccsStatus:
    """``npu-smi info -t hccs -i N -c C``: the health word and one entry per HCCS link."""

    health_raw: str = ""
    links: list[HccsLink] = field(default_factory=list)

    @property
    def links_down(self) -> int:
        return sum(not link.up for link in self.links)


def _bracketed(value: str) -> list[str]:
    """ "[1111 1111 0000]" -> ["1111", "1111", "0000"]; a bare value is a list of one."""
    return value.strip().strip("[]").split()


def _counts(values: list[str], n: int) -> list[int | None]:
    out: list[int | None] = [int(v) if v.isdigit() else None for v in values[:n]]
    return out + [None] * (n - len(out))


def parse_hccs(text: str) -> HccsStatus:
    """The HCCS links of one chip; no links where npu-smi printed no lane list."""
    fields: dict[str, str] = {}
    for raw in text.splitlines():
        key, sep, value = raw.partition(":")
        if sep:
            fields[key.strip().lower()] = value.strip()
    lanes = _bracketed(fields.get("hccs link lane list", ""))
    errors = _counts(_bracketed(fields.get("hccs error count", "")), len(lanes))
    retries = _counts(_bracketed(fields.get("hccs retry count", "")), len(lanes))
    links = [HccsLink(i, lane, errors[i], retries[i]) for i, lane in enumerate(lanes)]
    return HccsStatus(fields.get("hccs health status", ""), links)
