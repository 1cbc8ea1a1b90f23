"""NVIDIA's kernel-log lines: Xids (every form), fallen off the bus, NVSwitch SXids, peermem.

Each matcher reads one message. Xids 144-150 are decoded by sub-code and error status
(NVIDIA's decode sheet), Xid 154 by the recovery action it names; the rest by number.
An SXid is one event of up to three lines (the line with its class, then ``Severity`` and
``Data``): the first is reported, the others fold into it.
"""

from __future__ import annotations

import re

from agent.collectors.kmsg.family import FOLDED, SOURCE, Family, MatchResult, State
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.findings import Finding

_BUS = r"[0-9a-fA-F]{4,8}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}(?:\.[0-7])?"
# "NVRM: Xid (PCI:0000:9b:00): 79, ...", "(0000:03:00)", MIG "(PCI:0000:01:00 GPU-I:05)"
# (and GPU-CI), a cut line with no comma after the number.
_XID_RE = re.compile(
    rf"NVRM: Xid \((?:PCI:)?(?P<pci>{_BUS})(?: GPU-I:(?P<gi>\d+))?(?: GPU-CI:(?P<ci>\d+))?\)"
    r"[^:]*: (?P<xid>\d+)(?:,|\s|$)"
)
_PID_RE = re.compile(r"\bpid=([^,]*)")
_NAME_RE = re.compile(r"\bname=([^,]*)")
# Xid 144-150: "<sub-code> <Fatal|Nonfatal> XC0 i0 Link 13 (0xIntrInfo 0xErrorStatus ...)".
_NVLINK5_RE = re.compile(
    r"^\s*(?P<sub>[A-Z][A-Z0-9_]*(?: Degraded)?)\s+(?P<fatal>Fatal|Non-?fatal)\b.*?"
    r"(?:Link (?P<link>-?\d+))?\s*\((?P<intr>0x[0-9a-fA-F]+)\s+(?P<status>0x[0-9a-fA-F]+)",
    re.IGNORECASE,
)
# Xid 154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)".
_RECOVERY_RE = re.compile(r"recovery action changed from 0x[0-9a-fA-F]+ \(([^)]*)\) to 0x([0-9a-fA-F]+) \(([^)]*)\)")
# "NVRM: GPU 0000:18:00.0: GPU has fallen off the bus." and the older
# "NVRM: GPU at 0000:01:00.0 has fallen off the bus."
_FALLEN_RE = re.compile(rf"NVRM: GPU (?:at )?(?:PCI:)?(?P<pci>{_BUS}):? (?:GPU )?has fallen off the bus")
# "NVRM: The NVIDIA GPU 0000:b3:00.0 / (PCI ID: 10de:26b5) installed in this system has /
# fallen off the bus and is not responding to commands." (one record, or three journal lines)
_NOTICE_RE = re.compile(rf"NVRM: The NVIDIA GPU (?P<pci>{_BUS})")
_NOTICE_FALLEN_RE = re.compile(r"fallen off the bus and is not responding")
_SXID_RE = re.compile(rf"SXid \((?:PCI:)?(?P<pci>{_BUS})\): (?P<sxid>\d+),\s*(?P<rest>.*)")
_NVSWITCH_RE = re.compile(r"(nvidia-nvswitch\d+)")
_SXID_CLASS_RE = re.compile(r"^(Fatal|Non-fatal)\b", re.IGNORECASE)
_SXID_DETAIL_RE = re.compile(r"^(Severity \d|Data \{)")
_LINK_RE = re.compile(r"\bLink (\d+)\b")
_PEERMEM_RE = re.compile(r"nvidia-peermem\b.*\bERROR\b")


def _gpu_finding(kind: str, pci: str, action: str, severity: str, message: str, xid: int, **attrs: str) -> Finding:
    return Finding(
        kind=kind,
        component=f"gpu@{pci}",
        severity=severity,
        action=action,
        message=message,
        source=SOURCE,
        xid=xid,
        pci=pci,
        attributes={"pci": pci, **attrs},
    )


def _nvlink5(num: int, tail: str) -> tuple[str, str, dict[str, str]]:
    """(action, severity, attributes) of an Xid 144-150 message by NVIDIA's decode sheet."""
    m = _NVLINK5_RE.match(tail)
    if m is None:
        return vocab.ACTION_INVESTIGATE, "warning", {"decode": "unknown (message not in the 144-150 format)"}
    sub, says_fatal = m.group("sub"), m.group("fatal").lower() == "fatal"
    status = int(m.group("status"), 16)
    attrs = {"subcode": sub, "intr_info": m.group("intr"), "error_status": f"0x{status:08x}"}
    if m.group("link") is not None:
        attrs["link"] = m.group("link")
    if num == 149 and sub in xidcat.LINK_DOWN_SUBCODES:
        return _link_down(int(m.group("intr"), 16), says_fatal, attrs)
    row = xidcat.decode_nvlink5(num, sub, status)
    if row is None:
        # Not in any public decode: say so, and never ask for a reset on a non-fatal one.
        attrs["decode"] = "unknown"
        attrs["fatal"] = str(says_fatal).lower()
        return vocab.ACTION_INVESTIGATE, "critical" if says_fatal else "warning", attrs
    action = xidcat.bucket_action(row.bucket)
    if not row.fatal and action == vocab.ACTION_RESET_GPU:
        action = vocab.ACTION_INVESTIGATE
    attrs.update(decode=row.bucket, fatal=str(row.fatal).lower(), decode_severity=row.severity)
    severity = vocab.severity_for_action(action)
    return action, severity, attrs


def _link_down(intr: int, says_fatal: bool, attrs: dict[str, str]) -> tuple[str, str, dict[str, str]]:
    """Xid 149 NETIR_LINK_EVT by its link-down reason (IntrInfo bits 25:20), as the sheet
    decodes it; a reason the sheet does not list is "decode unknown", never a guessed reset."""
    reason = xidcat.link_down_reason(intr)
    attrs["link_down_reason"] = str(reason)
    row = xidcat.decode_link_down(reason)
    if row is None:
        attrs.update(decode="unknown", fatal=str(says_fatal).lower())
        return vocab.ACTION_INVESTIGATE, "critical" if says_fatal else "warning", attrs
    action = xidcat.bucket_action(row.bucket)
    attrs.update(decode=row.bucket, fatal=str(row.fatal).lower(), decode_severity=row.severity)
    attrs["investigate"] = row.investigate
    return action, vocab.severity_for_action(action), attrs


def _xid154(tail: str) -> tuple[str, str, dict[str, str]]:
    """(action, severity, attributes) of Xid 154 from the recovery action it names."""
    m = _RECOVERY_RE.search(tail)
    if m is None:
        return vocab.ACTION_INVESTIGATE, "warning", {"recovery_action": "unknown"}
    words = m.group(3)
    action = xidcat.named_recovery_action(words)
    attrs = {"recovery_action": words, "recovery_action_from": m.group(1), "recovery_action_code": f"0x{m.group(2)}"}
    if action is None:
        return vocab.ACTION_INVESTIGATE, "warning", {**attrs, "decode": "unknown"}
    return action, vocab.severity_for_action(action), attrs


def match_xid(message: str, state: State) -> MatchResult:
    """An ``NVRM: Xid`` line in any of its forms."""
    m = _XID_RE.search(message)
    if m is None:
        return None
    pci = m.group("pci")
    num = int(m.group("xid"))
    info = xidcat.lookup(num)
    tail = message[m.end() :]
    attrs: dict[str, str] = {"mnemonic": info.mnemonic, "bucket": info.immediate}
    for key, group in (("gpu_instance", "gi"), ("compute_instance", "ci")):
        if m.group(group) is not None:
            attrs[key] = str(int(m.group(group)))
    for key, rx in (("pid", _PID_RE), ("process", _NAME_RE)):
        pm = rx.search(tail)
        if pm:
            attrs[key] = pm.group(1).strip().strip("'")
    action, severity = info.action, info.severity
    if 144 <= num <= 150:
        action, severity, extra = _nvlink5(num, tail)
        attrs.update(extra)
    elif num == 154:
        action, severity, extra = _xid154(tail)
        attrs.update(extra)
    return _gpu_finding("xid", pci, action, severity, message, num, **attrs)


def _lost(pci: str, message: str) -> Finding:
    info = xidcat.lookup(79)
    return _gpu_finding("gpu_lost", pci, info.action, info.severity, message, 79, mnemonic=info.mnemonic)


def match_fallen(message: str, state: State) -> MatchResult:
    """Fallen off the bus without an Xid line: still Xid 79's action."""
    m = _FALLEN_RE.search(message)
    if m is not None:
        return _lost(m.group("pci"), message)
    n = _NOTICE_RE.search(message)
    if n is not None:
        if _NOTICE_FALLEN_RE.search(message, n.end()):
            return _lost(n.group("pci"), message)
        state.data["notice_pci"] = n.group("pci")  # the journal splits the notice: wait for its end
        state.data["notice_left"] = 3
        return FOLDED
    pending = state.data.get("notice_pci")
    if pending is not None and "NVRM:" in message:
        if _NOTICE_FALLEN_RE.search(message):
            state.data.pop("notice_pci", None)
            return _lost(str(pending), message)
        state.data["notice_left"] = int(state.data.get("notice_left", 0)) - 1
        if state.data["notice_left"] <= 0:
            state.data.pop("notice_pci", None)
        return FOLDED if "installed in this system" in message else None
    return None


def match_sxid(message: str, state: State) -> MatchResult:
    """An NVSwitch SXid; its Severity and Data lines fold into the event they belong to."""
    m = _SXID_RE.search(message)
    if m is None:
        return None
    pci, num, rest = m.group("pci"), int(m.group("sxid")), m.group("rest")
    key = f"{pci}/{num}"
    if _SXID_DETAIL_RE.match(rest):
        if state.data.get("sxid_open") == key:
            if rest.startswith("Data"):
                state.data.pop("sxid_open", None)  # the Data line ends the event
            return FOLDED
        fatal_word = None
    else:
        cm = _SXID_CLASS_RE.match(rest)
        fatal_word = cm.group(1).lower() == "fatal" if cm else None
        state.data["sxid_open"] = key
    info = xidcat.sxid_info(num)
    fatal = fatal_word if fatal_word is not None else (info.fatal if info is not None else None)
    attrs = {"pci": pci, "fatal": "unknown" if fatal is None else str(fatal).lower()}
    if info is not None:
        attrs["meaning"] = info.description
        if info.klass:
            attrs["sxid_class"] = info.klass
    sw = _NVSWITCH_RE.search(message)
    if sw:
        attrs["nvswitch"] = sw.group(1)
    lm = _LINK_RE.search(rest)
    if lm:
        attrs["link"] = lm.group(1)
    # fatal: the fabric must be reset (reboot); non-fatal: the guide's recovery for the code
    # where it names one (a restart for traffic it stalls), else a person looks
    action = vocab.ACTION_REBOOT if fatal else ((info.action if info is not None else "") or vocab.ACTION_INVESTIGATE)
    return Finding(
        kind="sxid",
        component=f"nvswitch@{pci}",
        severity="fatal" if fatal else "warning",
        action=action,
        message=message,
        source=SOURCE,
        xid=num,
        pci=pci,
        attributes=attrs,
    )


def match_peermem(message: str, state: State) -> MatchResult:
    """nvidia-peermem errors (GPUDirect RDMA): a kernel warning to investigate."""
    if not _PEERMEM_RE.search(message):
        return None
    return Finding(
        kind="kernel",
        component="nvidia-peermem",
        severity="warning",
        action=vocab.ACTION_INVESTIGATE,
        message=message,
        source=SOURCE,
        attributes={"module": "nvidia-peermem"},
    )


FAMILY = Family(
    name="nvidia",
    words=("NVRM", "SXid", "nvidia-peermem"),
    matchers=(match_xid, match_fallen, match_sxid, match_peermem),
)
