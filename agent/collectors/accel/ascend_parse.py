"""Parsers for what Huawei's ``npu-smi`` prints on an Ascend node.

``npu-smi info`` draws a table with two rows per chip: the first ``| NPU Name | Health |
Power(W) Temp(C) Hugepages |``, the second ``| Chip [Phy-ID|Device] | Bus-Id | AICore(%)
Memory-Usage(MB) [HBM-Usage(MB)] |``. The product lines differ in what they fill in: a 910A
prints a narrower first column and a bare ``Chip``; a 910B ``Chip`` or ``Chip Phy-ID``; an Atlas
A3 node two chips per NPU, the second with ``-`` for power (the NPU's power is on its first
chip); a 310P duo card (Atlas 300I Duo) two chips per card on one bus id, ``Chip Device``, power
``NA`` and no HBM column (its memory is ``Memory-Usage``); a 310B SoC (Atlas 200I/500 A2) a bus id
of ``NA``. The parser reads the table by its cells and the header's column names, not by widths,
so a layout it has not seen still gives its chips. A process table follows; it is skipped.

``npu-smi info -t health -i N -c C`` prints ``Health Status``, ``Error Code`` (several codes,
space separated, or ``NA``) and ``Error Information`` continued on later lines.
``npu-smi info -t hccs -i N -c C`` prints ``hccs <what> : value`` lines, the per-link ones as
bracketed lists with one entry per HCCS link (``hccs link lane list : [1111 1111 …]``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from starpulse.core import vocab

# npu-smi's health words (Huawei: OK normal, Warning minor alarm, Alarm major alarm, Critical
# critical alarm, UNKNOWN the device does not exist or has not started), as our grades. A major
# alarm can interrupt service, so Alarm is critical here, as Critical is.
HEALTH_GRADES = {"ok": "ok", "warning": "warning", "alarm": "critical", "critical": "critical"}

# A bus id as printed: a PCI address, or "NA"/"-" where the chip has none (a 310B SoC).
_PCI_RE = re.compile(r"^[0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7]$")
_PAIR_RE = re.compile(r"(\d+)\s*/\s*(\d+)")
_CODES_RE = re.compile(r"(?<![0-9A-Za-z])(?:0x)?([0-9A-Fa-f]{8})(?![0-9A-Za-z])")


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

    @property
    def pci(self) -> str:
        """The bus id as Linux writes it; "" where npu-smi prints none (a 310B SoC's ``NA``)."""
        return vocab.canonical_pci(self.bus_id) if _PCI_RE.fullmatch(self.bus_id) else ""

    @property
    def device_memory_mb(self) -> tuple[int, int]:
        """(used, total) of the chip's own memory: HBM where it has it, else Memory-Usage (310P, 310B)."""
        if self.hbm_total_mb:
            return self.hbm_used_mb, self.hbm_total_mb
        return self.memory_used_mb, self.memory_total_mb


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


def _cells(line: str) -> list[str] | None:
    """The cells of a table row ``| a | b | c |``; None for borders and other lines."""
    text = line.strip()
    if not (text.startswith("|") and text.endswith("|")) or len(text) < 2:
        return None
    return [c.strip() for c in text[1:-1].split("|")]


def _ids(text: str) -> tuple[int, int | None] | None:
    """``0`` or ``0  3`` (chip, then Phy-ID or Device; ``-``/``NA`` where not given); None if not ids."""
    words = text.split()
    if not words or len(words) > 2 or not words[0].isdigit():
        return None
    if len(words) == 1:
        return int(words[0]), None
    if words[1].isdigit():
        return int(words[0]), int(words[1])
    return (int(words[0]), None) if words[1].upper() in ("-", "NA", "N/A") else None


@dataclass
class _Columns:
    """What the header's second row names: the usage columns after AICore, in order."""

    usage: list[str] = field(default_factory=lambda: ["memory", "hbm"])

    @classmethod
    def from_header(cls, cell: str) -> _Columns:
        names = [w.lower() for w in cell.split() if "usage" in w.lower()]
        usage = ["hbm" if n.startswith("hbm") else "memory" for n in names]
        return cls(usage or ["memory", "hbm"])


def _first_row(cells: list[str]) -> NpuChip | None:
    """``| 0  910B4 | OK | 88.2  30  0 / 0 |``: the NPU id, model, health, power and temperature."""
    if len(cells) < 3:
        return None
    head = cells[0].split(None, 1)
    if len(head) != 2 or not head[0].isdigit() or not cells[1] or " " in cells[1]:
        return None
    readings = cells[2].split()
    power = _number(readings[0]) if readings else None
    temp = _number(readings[1]) if len(readings) > 1 else None
    return NpuChip(int(head[0]), -1, head[1].strip(), cells[1], power_w=power, temperature_c=temp)


def _second_row(cells: list[str], chip: NpuChip, columns: _Columns) -> bool:
    """``| 0  [phy] | bus | aicore  mem / total  [hbm / total] |`` filled into ``chip``; False if not one."""
    if len(cells) < 3:
        return False
    ids = _ids(cells[0])
    bus = cells[1]
    if ids is None or not (_PCI_RE.fullmatch(bus) or bus.upper() in ("NA", "N/A", "-")):
        return False
    chip.chip_id, chip.phy_id = ids
    chip.bus_id = bus
    words = cells[2].split()
    chip.aicore_pct = _number(words[0]) if words else None
    pairs = [(int(a), int(b)) for a, b in _PAIR_RE.findall(cells[2])]
    for name, (used, total) in zip(columns.usage, pairs, strict=False):
        if name == "hbm":
            chip.hbm_used_mb, chip.hbm_total_mb = used, total
        else:
            chip.memory_used_mb, chip.memory_total_mb = used, total
    return True


def parse_npu_smi_info(text: str) -> list[NpuChip]:
    """Every chip of an ``npu-smi info`` table, in the order printed (the process table is ignored)."""
    chips: list[NpuChip] = []
    columns = _Columns()
    pending: NpuChip | None = None
    for raw in text.splitlines():
        cells = _cells(raw)
        if cells is None:
            continue
        if len(cells) > 1 and "process" in cells[1].lower():
            break  # the process table: nothing more about chips
        if cells[0].startswith("Chip") and len(cells) > 2 and "AICore" in cells[2]:
            columns = _Columns.from_header(cells[2])
            continue
        if pending is not None and _second_row(cells, pending, columns):
            chips.append(pending)
            pending = None
            continue
        pending = _first_row(cells)
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
        if key.lower() == "health status":
            health.health_raw, in_info = value, False
        elif key.lower() == "error code":
            # Space separated as printed; a "0x" or a comma some versions and quotes add is dropped.
            health.error_codes = [c.upper() for c in _CODES_RE.findall(value)]
            in_info = False
        elif key.lower() == "error information":
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
