"""amdgpu GPU VM page faults, in every form the driver has printed, folded into one finding each.

A fault is a header, ``[gfxhub0] no-retry page fault (src_id:0 ring:24 vmid:3 pasid:32769)``
(``gfxhub``/``mmhub``, numbered or not; ``retry``, ``no-retry`` or neither), then the process,
then the address, the protection-fault status and its decoded fields. Older drivers put the
process in the header (``..., for process NAME pid N thread NAME pid N)``); newer ones on the next
line, spelled `` for process``, `` in process`` or `` Process``. The finding names the process, so
it is reported at the process line when the header lacks it (the header is held until then), and
every later line of the fault, and every further fault of the same process (pasid) on the same
device in the same burst, folds into it. The faulting process is killed ("Memory access fault by
GPU node"): an application fault, restart it (AMD's node-scraper lists these as errors).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.collectors.kmsg.amdgpu_base import finding
from agent.collectors.kmsg.family import FOLDED, MatchResult
from starpulse.core import vocab
from starpulse.core.findings import Finding

_HEADER_RE = re.compile(
    r"\[(?P<hub>\w+)\] (?:(?P<retry>retry|no-retry) )?page fault \(src_id:\d+ ring:(?P<ring>\d+) "
    r"vmid:(?P<vmid>\d+) pasid:(?P<pasid>\d+)"
    r"(?:, for process (?P<process>\S*) pid (?P<pid>\d+) thread (?P<thread>\S*) pid (?P<tid>\d+))?"
)
_PROCESS_RE = re.compile(
    r"^\s*(?:for process|in process|Process) (?P<process>\S*) pid (?P<pid>\d+) thread (?P<thread>\S*) pid (?P<tid>\d+)"
)
_DETAIL_RE = re.compile(
    r"in page starting at address|cookie node_id|_PROTECTION_FAULT_STATUS|Faulty UTCL2 client ID"
    r"|\b(?:MORE_FAULTS|WALKER_ERROR|PERMISSION_FAULTS|MAPPING_ERROR|RW):"
)


@dataclass
class VmFaults:
    """Per device: the fault held for its process line, and the pasid of the burst reported."""

    pending: dict[str, Finding] = field(default_factory=dict)
    open_pasid: dict[str, str] = field(default_factory=dict)

    def take_pending(self, pci: str) -> Finding | None:
        """The held fault of a device, now reported without its process (its lines ended)."""
        f = self.pending.pop(pci, None)
        if f is not None:
            self.open_pasid[pci] = f.attributes.get("pasid", "")
        return f

    def close(self, pci: str) -> None:
        """The device printed something else: its burst is over."""
        self.open_pasid.pop(pci, None)


def _with_process(f: Finding, m: re.Match[str]) -> Finding:
    f.attributes.update({k: v for k, v in m.groupdict().items() if v is not None})
    return f


def match_vm(message: str, rest: str, pci: str, faults: VmFaults) -> MatchResult:
    """A VM-fault line: the finding, FOLDED (part of one), or None (not a VM-fault line)."""
    m = _HEADER_RE.search(rest)
    if m is not None:
        pasid = m.group("pasid")
        held = faults.pending.get(pci)
        if held is not None and held.attributes.get("pasid") == pasid:
            if m.group("process") is None:
                return FOLDED
            faults.pending.pop(pci)
            faults.open_pasid[pci] = pasid
            return _with_process(held, m)
        if held is None and faults.open_pasid.get(pci) == pasid:
            return FOLDED
        attrs = {
            k: v for k, v in m.groupdict().items() if v is not None and k not in ("process", "pid", "thread", "tid")
        }
        attrs["reason"] = "GPU VM page fault"
        f = finding("accel_fault", pci, vocab.ACTION_RESTART_APP, "vm_fault", message, attrs)
        if m.group("process") is None:
            faults.pending[pci] = f
            return FOLDED
        faults.open_pasid[pci] = pasid
        return _with_process(f, m)
    if pci in faults.pending:
        pm = _PROCESS_RE.search(rest)
        if pm is not None:
            f = faults.pending.pop(pci)
            faults.open_pasid[pci] = f.attributes.get("pasid", "")
            return _with_process(f, pm)
        if _DETAIL_RE.search(rest):
            return faults.take_pending(pci)
        return None
    if pci in faults.open_pasid and (_DETAIL_RE.search(rest) or _PROCESS_RE.search(rest)):
        return FOLDED
    return None
