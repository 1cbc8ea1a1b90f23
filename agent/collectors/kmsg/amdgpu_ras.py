"""amdgpu RAS lines: per-block error counts, poison, fatal interrupts, bad pages, ACA bank dumps.

What each line means and the action (AMD's words; where AMD names none, ours, and said so):

- ``N [new] uncorrectable hardware errors detected in <block> block`` (every spelling: the old
  ``amdgpu:`` one, MI300's ``{E}socket: S, die: D, N new ...``, ``UMC`` upper case from the page
  retirement path) and ``Uncorrectable error detected in UMC inst: I, chan_idx: C``: the shared
  ``ecc_dbe`` kind, reset the GPU (AMD: an uncorrectable error is recovered by a GPU reset). The
  block is the vendor code. A count of 0 and the ``no uncorrectable ...`` all-clear are not faults.
- ``... correctable hardware errors detected in <block> block``: corrected by the hardware; a
  finding with action ``none`` so it is recorded and opens nothing.
- ``... deferred hardware errors detected in <block> block``: poisoned data not yet used; AMD's
  analyzer counts it as an error, the driver retires the page. Ours: investigate.
- ``poison is consumed by client N, kick off gpu reset flow`` and ``N poison consumption detected
  in total in <block> block``: poisoned data was used, reset. ``Poison is created, no user
  action is needed``: as it says.
- ``... detected in total in <block> block``: the running total printed under the "new" line of
  the same event: part of that record (read as the count itself where the "new" line is missing).
- ``uncorrectable hardware error(ERREVENT_...) detected!``: a fatal RAS interrupt; the driver
  resets the GPU (the hive on MI300): reset.
- ``Saved bad pages N reaches threshold value T`` / ``RAS records:N exceed threshold:T``: ROCm's
  RAS guidance: replace the GPU (``contact_support``).
- ACA/MCA bank dumps (``Accelerator Check Architecture events logged`` then ``aca entry[NN].REG=``
  or ``ACA[i/n].REG=`` lines): one record per dump burst of a device. The severity is the MCA
  STATUS word's (Val 63, UC 61, PCC 57, Deferred 44, Poison 43): uncorrected -> reset, deferred or
  poisoned -> investigate, corrected -> none. A later bank that is worse opens a new finding. The
  RAS count line that follows names the banks that explain it (``aca_banks``, ``aca_status``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from agent.collectors.kmsg.amdgpu_base import finding
from agent.collectors.kmsg.family import FOLDED, MatchResult
from starpulse.core import vocab

_COUNT_RE = re.compile(
    r"(?<!no )\b(?P<count>\d+) (?P<new>new )?(?P<what>uncorrectable|correctable|deferred) hardware errors "
    r"detected in (?P<total>total in )?(?P<block>\w+) block"
)
_POISON_TOTAL_RE = re.compile(
    r"\b(?P<count>\d+) (?:new )?poison consumption detected in (?:total in )?(?P<block>\w+) block"
)
_UMC_INST_RE = re.compile(r"Uncorrectable error detected in UMC inst: (?P<inst>\d+), chan_idx: (?P<chan>\d+)")
_POISON_CONSUMED_RE = re.compile(r"poison is consumed by client (?P<client>\d+)", re.IGNORECASE)
_POISON_CREATED_RE = re.compile(r"Poison is created")
_FATAL_RE = re.compile(r"uncorrectable hardware error\s*\((?P<source>\w+)\) detected")
_BAD_PAGES_RE = re.compile(
    r"Saved bad pages (?P<count>\d+) reaches threshold value (?P<threshold>\d+)"
    r"|RAS records:(?P<records>\d+) exceed threshold:(?P<limit>\d+)"
)
_PAGE_ADDRESS_RE = re.compile(r"Error Address\(PA\):")
ACA_HEADER_RE = re.compile(r"Accelerator Check Architecture events logged")
ACA_REG_RE = re.compile(
    r"(?:aca entry\[(?P<entry>\d+)\]|ACA\[(?P<idx>\d+)/(?P<total>\d+)\])\.(?P<reg>\w+)=0x(?P<value>[0-9a-fA-F]+)"
)

# (rank, action, code) by what the MCA STATUS word says.
_ACA_UC = (3, vocab.ACTION_RESET_GPU, "aca_uncorrectable")
_ACA_DEFERRED = (2, vocab.ACTION_INVESTIGATE, "aca_deferred")
_ACA_POISON = (2, vocab.ACTION_INVESTIGATE, "aca_poison")
_ACA_CE = (1, vocab.ACTION_NONE, "aca_corrected")


def aca_severity(status: int) -> tuple[int, str, str] | None:
    """(rank, action, code) of an MCA STATUS word; None when the bank holds no valid error."""
    if not status >> 63 & 1:
        return None
    if status >> 61 & 1:
        return _ACA_UC
    if status >> 44 & 1:
        return _ACA_DEFERRED
    if status >> 43 & 1:
        return _ACA_POISON
    return _ACA_CE


@dataclass
class AcaBurst:
    """The ACA banks one device is dumping now (or dumped last), for one RAS event."""

    event: str
    banks: int = 0
    rank: int = 0
    status: str = ""
    active: bool = True


def match_aca(message: str, rest: str, pci: str, event: str, bursts: dict[str, AcaBurst]) -> MatchResult:
    """An ACA dump line: the header and registers fold, the STATUS that sets the severity reports."""
    if ACA_HEADER_RE.search(rest):
        burst = bursts.get(pci)
        if burst is None or not burst.active or burst.event != event:
            burst = bursts[pci] = AcaBurst(event)
        burst.banks += 1
        return FOLDED
    m = ACA_REG_RE.search(rest)
    if m is None:
        return None
    burst = bursts.setdefault(pci, AcaBurst(event, banks=1))
    if m.group("reg") != "STATUS":
        return FOLDED
    sev = aca_severity(int(m.group("value"), 16))
    if sev is None or sev[0] <= burst.rank:
        return FOLDED
    burst.rank, burst.status = sev[0], "0x" + m.group("value").lower()
    attrs = {
        "reason": "ACA bank dump",
        "aca_status": burst.status,
        "aca_bank": m.group("entry") or m.group("idx") or "",
    }
    if event:
        attrs["ras_event"] = event
    return finding("accel_fault", pci, sev[1], sev[2], message, attrs)


def match_ras(
    message: str, rest: str, pci: str, event: str, burst: AcaBurst | None, open_code: str = ""
) -> MatchResult:
    """A RAS count, poison, fatal-interrupt or bad-page line; None for anything else.

    ``open_code`` is the code of the record the device has open: a poison total under its own
    "new" line is part of it.
    """
    attrs: dict[str, str] = {"ras_event": event} if event else {}
    if burst is not None and burst.event == event and burst.banks:
        attrs.update(aca_banks=str(burst.banks), aca_status=burst.status)
    m = _COUNT_RE.search(rest)
    if m is not None:
        count, block, what = int(m.group("count")), m.group("block").upper(), m.group("what")
        if m.group("total") and open_code in (block, "ras_ce", "ras_deferred"):
            return FOLDED  # the running total under the "new" line of the same event
        if count == 0:
            return None
        attrs.update(block=block, count=str(count))
        if what == "uncorrectable":
            return finding("ecc_dbe", pci, vocab.ACTION_RESET_GPU, block, message, attrs)
        if what == "deferred":
            return finding("accel_fault", pci, vocab.ACTION_INVESTIGATE, "ras_deferred", message, attrs)
        return finding("accel_fault", pci, vocab.ACTION_NONE, "ras_ce", message, attrs)
    m = _UMC_INST_RE.search(rest)
    if m is not None:
        attrs.update(block="UMC", umc_inst=m.group("inst"), chan_idx=m.group("chan"))
        return finding("ecc_dbe", pci, vocab.ACTION_RESET_GPU, "UMC", message, attrs)
    m = _POISON_CONSUMED_RE.search(rest) or _POISON_TOTAL_RE.search(rest)
    if m is not None and "total in" in rest and open_code == "poison_consumed":
        return FOLDED
    if m is not None:
        attrs.update({k: v for k, v in m.groupdict().items() if v})
        attrs["reason"] = "poisoned data consumed"
        return finding("accel_fault", pci, vocab.ACTION_RESET_GPU, "poison_consumed", message, attrs)
    if _POISON_CREATED_RE.search(rest) or _PAGE_ADDRESS_RE.search(rest):
        return FOLDED  # "no user action is needed"; a retired page's address belongs to its UE
    m = _FATAL_RE.search(rest)
    if m is not None:
        attrs.update(source=m.group("source"), reason="fatal RAS interrupt")
        return finding("accel_fault", pci, vocab.ACTION_RESET_GPU, "ras_fatal", message, attrs)
    m = _BAD_PAGES_RE.search(rest)
    if m is not None:
        attrs.update({k: v for k, v in m.groupdict().items() if v})
        attrs["reason"] = "retired pages past the bad-page threshold: replace the GPU"
        return finding("accel_fault", pci, vocab.ACTION_CONTACT_SUPPORT, "bad_page_threshold", message, attrs)
    return None
