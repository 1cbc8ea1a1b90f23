"""AMD GPU faults in the kernel log: the ``amdgpu`` driver's RAS, poison, reset and ring-timeout lines.

One more pattern family of the kernel-log reader (``kmsg.reader.FAMILIES``). The driver names
the device by its PCI address (``amdgpu 0000:c1:00.0:``), which the agent turns into the GPU's
index as it does for NVIDIA's Xids. What each line means:

- ``N uncorrectable hardware errors detected in <block> block`` (also the ``socket: S`` and
  ``{seq} socket: S, die: D, N new ...`` spellings of newer drivers): an uncorrectable memory
  error, the shared ``ecc_dbe`` kind (reset the GPU); the block is the ``vendor_code``. The
  all-clear ``no uncorrectable hardware errors detected`` and a count of 0 are not faults.
- ``poison is consumed by client N, kick off gpu reset flow``: poisoned data was used; reset.
- ``ring <name> timeout, signaled seq=..., emitted seq=...``: a hung job; the driver resets the
  GPU next, so the job must restart (``restart_app``), and a repeat is the rules' business.
- ``GPU reset begin!``: the driver is resetting the GPU (a hang); the job on it is lost.
- ``GPU reset(N) failed`` / ``GPU reset failed``: the GPU could not be recovered: reboot.
- ``Poison is created, no user action is needed.``: as it says, nothing.
"""

from __future__ import annotations

import re

from agent.collectors.kmsg.family import SOURCE, Family, MatchResult, State
from starpulse.core import vocab
from starpulse.core.findings import Finding

VENDOR = "amd"

_DEVICE_RE = re.compile(r"\bamdgpu (?P<pci>[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]):")
_UE_RE = re.compile(r"(?<!no )\b(?P<count>\d+) (?:new )?uncorrectable hardware errors detected in (?P<block>\w+) block")
_POISON_CONSUMED_RE = re.compile(r"poison is consumed by client (?P<client>\d+)", re.IGNORECASE)
_RING_TIMEOUT_RE = re.compile(
    r"\bring (?P<ring>\S+) timeout, signaled seq=(?P<signaled>\d+), emitted seq=(?P<emitted>\d+)"
)
_RESET_BEGIN_RE = re.compile(r"\bGPU reset begin!")
_RESET_FAILED_RE = re.compile(r"\bGPU reset(?:\(\d+\))? failed")

# (pattern, finding kind, action, vendor code, what it means)
_FAULTS: tuple[tuple[re.Pattern[str], str, str, str, str], ...] = (
    (_POISON_CONSUMED_RE, "accel_fault", vocab.ACTION_RESET_GPU, "poison_consumed", "poisoned data consumed"),
    (_RESET_FAILED_RE, "accel_fault", vocab.ACTION_REBOOT, "gpu_reset_failed", "GPU reset failed"),
    (_RING_TIMEOUT_RE, "accel_fault", vocab.ACTION_RESTART_APP, "ring_timeout", "ring timeout (a hung job)"),
    (_RESET_BEGIN_RE, "accel_fault", vocab.ACTION_RESTART_APP, "gpu_reset", "the driver resets the GPU (hang)"),
)


def classify_amdgpu(message: str) -> Finding | None:
    """The finding an amdgpu kernel message stands for, or None for an ordinary line."""
    dev = _DEVICE_RE.search(message)
    pci = dev.group("pci").lower() if dev else ""
    component = f"gpu@{pci}" if pci else "gpu"
    m = _UE_RE.search(message)
    if m is not None:
        count = int(m.group("count"))
        if count == 0:
            return None
        block = m.group("block").upper()
        return _finding(
            "ecc_dbe",
            component,
            pci,
            vocab.ACTION_RESET_GPU,
            block,
            message,
            {"block": block, "count": str(count)},
        )
    for rx, kind, action, code, reason in _FAULTS:
        m = rx.search(message)
        if m is not None:
            attrs = {"reason": reason, **{k: v for k, v in m.groupdict().items() if v}}
            return _finding(kind, component, pci, action, code, message, attrs)
    return None


def _finding(
    kind: str, component: str, pci: str, action: str, code: str, message: str, attrs: dict[str, str]
) -> Finding:
    if pci:
        attrs["pci"] = pci
    return Finding(
        kind=kind,
        component=component,
        severity=vocab.severity_for_action(action),
        action=action,
        message=message,
        source=SOURCE,
        pci=pci or None,
        attributes=attrs,
        vendor=VENDOR,
        vendor_code=code,
    )


def match_amdgpu(message: str, state: State) -> MatchResult:
    """The family's one matcher: amdgpu lines need no state across lines."""
    return classify_amdgpu(message)


FAMILY = Family(name="amdgpu", words=("amdgpu",), matchers=(match_amdgpu,))
