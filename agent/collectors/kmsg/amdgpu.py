"""AMD GPU faults in the kernel log: every shape the ``amdgpu`` driver prints, one finding per record.

One more pattern family of the kernel-log reader (``kmsg.reader.FAMILIES``). The driver prints
most faults over several lines: a RAS count under its ACA bank dump, a VM fault's header, process,
address and decoded status, a hang's ring timeout then process, a reset's teardown failures, a lost
GPU's cascade of SMU and KIQ errors. The family keeps, per device, the record it has open and folds
the lines that belong to it, so each event is one finding with the device as printed.

    amdgpu_base   device, RAS event id, the finding
    amdgpu_ras    RAS counts, poison, fatal interrupts, bad pages, ACA bank dumps
    amdgpu_vm     GPU VM page faults (process named)
    amdgpu_hang   ring timeouts, resets, MES, KIQ/QCM, SMU, init, XGMI; what folds into each

Each module says what its lines mean and where the action comes from (AMD's words, or ours).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from agent.collectors.kmsg.amdgpu_base import VENDOR, device, rest_of
from agent.collectors.kmsg.amdgpu_hang import FOLDS, closes, match_hang
from agent.collectors.kmsg.amdgpu_ras import AcaBurst, match_aca, match_ras
from agent.collectors.kmsg.amdgpu_vm import VmFaults, match_vm
from agent.collectors.kmsg.family import FOLDED, Family, MatchResult, State, _Folded
from starpulse.core.findings import Finding

__all__ = ["FAMILY", "VENDOR", "classify_amdgpu", "match_amdgpu"]


@dataclass
class AmdLog:
    """What the family remembers of one log: open records, ACA bursts and VM faults per device."""

    open: dict[str, str] = field(default_factory=dict)  # device ("" for none) -> code of its open record
    last: str = ""  # the device of the record opened last (lines naming no device belong there)
    aca: dict[str, AcaBurst] = field(default_factory=dict)
    vm: VmFaults = field(default_factory=VmFaults)

    def open_code(self, pci: str) -> str:
        """The open record a line of this device (or of none) belongs to."""
        if not pci or (pci not in self.open and self.last == ""):
            return self.open.get(self.last, "")
        return self.open.get(pci, "")


def _log(state: State) -> AmdLog:
    log = state.data.get("amd")
    if not isinstance(log, AmdLog):
        log = state.data["amd"] = AmdLog()
    return log


def _read(message: str, log: AmdLog) -> MatchResult:
    pci = device(message)
    rest, event = rest_of(message)
    aca = match_aca(message, rest, pci, event, log.aca)
    if aca is not None:
        return aca
    burst = log.aca.get(pci)
    if burst is not None:
        burst.active = False
    got = match_vm(message, rest, pci, log.vm)
    if got is not None:
        return got
    if closes(rest):
        log.open.pop(pci, None)
        return None
    code = log.open_code(pci)
    started = match_ras(message, rest, pci, event, burst, code) or match_hang(message, rest, pci)
    fold = FOLDS.get(code)
    # A line naming no device folds into a device's record if it starts nothing itself, or if
    # the DRM core printed it ("[drm:fn [amdgpu]] *ERROR* ..." names no device in any kernel).
    own = pci or log.last == "" or not isinstance(started, Finding) or message.lstrip().startswith("[drm:")
    if fold is not None and fold.search(rest) and own:
        return FOLDED
    return started


def match_amdgpu(message: str, state: State) -> MatchResult:
    """The family's one matcher: the finding a record starts, FOLDED for its later lines, or None."""
    log = _log(state)
    pci = device(message)
    held = log.vm.pending.get(pci) if pci else None
    got = _read(message, log)
    if held is not None and pci in log.vm.pending and got is None:
        got = log.vm.take_pending(pci)  # the fault's lines ended before naming its process
    elif pci and not isinstance(got, _Folded) and got is None:
        log.vm.close(pci)
    if isinstance(got, Finding):
        log.open[pci] = got.vendor_code
        log.last = pci
    return got


def classify_amdgpu(message: str) -> Finding | None:
    """The finding one amdgpu message stands for on its own (no log around it)."""
    got = match_amdgpu(message, State())
    return got if isinstance(got, Finding) else None


FAMILY = Family(name="amdgpu", words=("amdgpu",), matchers=(match_amdgpu,))
