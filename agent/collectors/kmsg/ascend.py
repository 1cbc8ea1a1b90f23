"""Huawei Ascend NPU faults in the kernel log: the host driver's lines, one finding per event.

One more pattern family of the kernel-log reader (``kmsg.reader.FAMILIES``). What the driver
prints for a fault, and what Huawei's words make of it:

- a lost heartbeat (``Heartbeat lost! (device_id=3; ...)``, ``The device urgent heartbeat is
  lost!``, a UB device's ``Device heart beat lost``): the driver marks the device
  COMMUNICATION_LOST, stops its messages and its task scheduler, and recovers it by a hot reset
  ("resume by hot-reset"): reset the chip. The message failures that follow (``Heartbeat
  broken``, ``Device is abnormal``, ``send_msg unsuccessful``) belong to the loss;
- a device the host can no longer message (``Device is abnormal. (dev_id=5; ...)``) with no
  heartbeat line before it: reset the chip (our choice; Huawei names none);
- a task-scheduler firmware exception (``Get mntn message. (exception_id=0x...)``, ``receive ts
  exception message from device(N)``) and the
  mailbox timeouts after it: reset the chip (a 310B, which cannot be reset, needs a reboot);
- a failed hot reset (``Pcie hotreset error``): reboot the node (our choice);
- an AI Core or AI CPU that raised an exception (``receive message ai core: 3 exception.
  dev_id(0)``): the driver takes the core out of use, so the chip runs on fewer cores:
  investigate (our choice);
- fault events and black-box exceptions (``ascend_events``): each code's MindCluster level.

A record stays open per device until the driver says it recovered (``fault recover``, a
rescan after a hot reset, a heartbeat started again); lines naming no device belong to the record
opened last. Lines that only follow a fault (message failures, mailbox timeouts) give nothing on
their own, and the driver's process and memory bookkeeping is never a fault.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from agent.collectors.kmsg.ascend_base import VENDOR, AscendLine, finding, parse
from agent.collectors.kmsg.ascend_events import match_bbox, match_event
from agent.collectors.kmsg.family import FOLDED, Family, MatchResult, State
from starpulse.core import vocab
from starpulse.core.findings import Finding

__all__ = ["FAMILY", "VENDOR", "classify_ascend", "match_ascend"]

_HEARTBEAT_RE = re.compile(r"\bheart ?beat (?:is )?lost\b(?! workqueue| event)|\blost heart ?beat\b", re.IGNORECASE)
_ABNORMAL_RE = re.compile(r"\bdevice is abnormal\b", re.IGNORECASE)
_TS_RE = re.compile(r"\bGet mntn message\b|\breceive ts exception message\b")
_CORE_RE = re.compile(r"\bai (?P<unit>core|cpu): (?P<core>\d+) (?:heart beat )?exception\b", re.IGNORECASE)
_EXCEPTION_ID_RE = re.compile(r"\bexception_id=0x(?P<id>[0-9a-fA-F]+)")
_RESET_FAILED_RE = re.compile(r"\bhot ?reset (?:error|fail(?:ed|ure)?)\b|\bcan ?not hot ?reset\b", re.IGNORECASE)
# Lines that only follow a fault: the driver stopping messages, messages failing, mailbox timeouts.
_FOLLOW_RE = re.compile(
    r"heartbeat broken|heart ?beat lost (?:workqueue|event)|stop (?:all )?(?:h2d )?(?:msg|message) send"
    r"|send_?msg unsuccessful|wait event timeout|channel idle timeout|icm send msg failed|mailbox\S* timeout"
    r"|\bdevice reset\b|hot reset flag is set",
    re.IGNORECASE,
)
_RECOVERED_RE = re.compile(r"\bfault recover\b|\brescan device\b|heartbeat already initialized", re.IGNORECASE)

HEARTBEAT = "heartbeat_lost"
ABNORMAL = "device_abnormal"
TS_EXCEPTION = "ts_exception"
RESET_FAILED = "hotreset_failed"
CORE_EXCEPTION = "core_exception"
# What a starting line may fold into (the open record's code), when it is of the same device.
_FOLDS_INTO = {HEARTBEAT: {HEARTBEAT}, ABNORMAL: {HEARTBEAT, ABNORMAL}}


@dataclass
class AscendLog:
    """What the family remembers of one log: the open record per device and the last one opened."""

    open: dict[str, str] = field(default_factory=dict)  # device ("" for none) -> code of its open record
    last: str | None = None


def _log(state: State) -> AscendLog:
    log = state.data.get("ascend")
    if not isinstance(log, AscendLog):
        log = state.data["ascend"] = AscendLog()
    return log


def _starts(line: AscendLine) -> str:
    """The record a line starts ('' for none)."""
    if _HEARTBEAT_RE.search(line.rest):
        return HEARTBEAT
    if _ABNORMAL_RE.search(line.rest):
        return ABNORMAL
    if _TS_RE.search(line.rest):
        return TS_EXCEPTION
    if _RESET_FAILED_RE.search(line.rest):
        return RESET_FAILED
    if _CORE_RE.search(line.rest):
        return CORE_EXCEPTION
    return ""


def _new(code: str, line: AscendLine) -> Finding:
    dev = line.device
    who = f"NPU device {dev}" if dev else "an NPU"
    if code == HEARTBEAT:
        return finding(code, vocab.ACTION_RESET_GPU, f"Ascend {who} lost its heartbeat: the host cannot reach it", dev)
    if code == ABNORMAL:
        return finding(code, vocab.ACTION_RESET_GPU, f"Ascend {who} is abnormal: the host cannot message it", dev)
    if code == TS_EXCEPTION:
        m = _EXCEPTION_ID_RE.search(line.rest)
        attrs = {"exception": "0x" + m.group("id").lower()} if m else {}
        return finding(code, vocab.ACTION_RESET_GPU, f"Ascend task-scheduler firmware exception on {who}", dev, attrs)
    if code == CORE_EXCEPTION:
        m = _CORE_RE.search(line.rest)
        unit, core = ("AI " + m.group("unit").upper(), m.group("core")) if m else ("AI core", "")
        message = f"{unit} {core} of Ascend {who} raised an exception and was taken out of service"
        return finding(f"ai_{unit[3:].lower()}_exception", vocab.ACTION_INVESTIGATE, message, dev, {"core": core})
    return finding(code, vocab.ACTION_REBOOT, f"hot reset of Ascend {who} failed", dev)


def _owner(log: AscendLog, device: str) -> str | None:
    """The device whose open record a line of ``device`` belongs to (None: no open record)."""
    if device:
        return device if device in log.open else None
    return log.last if log.last is not None and log.last in log.open else None


def match_ascend(message: str, state: State) -> MatchResult:
    """The family's one matcher: the finding a record starts, FOLDED for its later lines, or None."""
    line = parse(message)
    if line is None:
        return None
    log = _log(state)
    if _RECOVERED_RE.search(line.rest):
        if line.device:
            log.open.pop(line.device, None)
        else:
            log.open.clear()
        return None
    got = match_event(line) or match_bbox(line)
    if got is not None:
        return got
    code = _starts(line)
    owner = _owner(log, line.device)
    held = log.open.get(owner) if owner is not None else None
    if code:
        if held is not None and held in _FOLDS_INTO.get(code, set()):
            return FOLDED
        log.open[line.device] = code
        log.last = line.device
        return _new(code, line)
    if held is not None and _FOLLOW_RE.search(line.rest):
        return FOLDED
    return None


def classify_ascend(message: str) -> Finding | None:
    """The finding one Ascend driver message stands for on its own (no log around it)."""
    got = match_ascend(message, State())
    return got if isinstance(got, Finding) else None


FAMILY = Family(name="ascend", words=("[ascend]",), matchers=(match_ascend,))
