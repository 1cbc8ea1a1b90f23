"""amdgpu hangs, resets and firmware failures: what starts a record, and what belongs to one.

Starters and their actions (AMD's words, or ours where AMD gives none, as marked):

- ``ring <name> timeout, signaled seq=..., emitted seq=...``: a hung job; the driver kills it and
  resets the ring or the GPU: restart the job. The `` Process ...`` line after it is the same record.
- ``Ring <name> reset failed``: the per-ring reset failed and the driver falls back to a full GPU
  reset, whose own lines decide. Ours: restart the job.
- ``GPU reset begin!``: the driver resets the GPU (a hang); the job on it is lost. What fails while
  the reset runs (MES, KIQ/KGQ/KCQ, halting the CP, evicting queues) is the reset's own teardown.
- ``GPU reset(N) failed``, ``Mode1/Mode2/BACO reset failed``, ``GPU Recovery Failed``: the GPU
  could not be recovered; ROCm#3766: a reboot is needed.
- ``GPU reset(N) succeeded!`` / ``GPU reset succeeded, trying to resume``: recovered; closes the
  record, no finding.
- ``device lost from bus!`` and ``SMU: response:0xFFFFFFFF ...``: the GPU no longer answers on
  the bus (reads return all ones, as the kernel maintainer says in bugzilla 215958): ``gpu_lost``,
  reboot; every later failure of that device is part of the loss.
- ``MES failed to respond to msg=...`` / ``MES might be in unrecoverable state, issue a GPU reset``:
  the driver's own words: reset the GPU.
- ``qcm fence wait loop timeout expired`` (AMD's node-scraper lists it), ``timeout waiting for kiq
  fence``, ``ring kiq_... test failed``, ``failed to write reg ... wait reg``: the command
  processor does not answer ("The cp might be in an unrecoverable state"). Ours: reset the GPU.
- ``SMU: I'm not done with your previous command``, ``SMU: No response``, ``SMU is in hanged
  state``: the power-management firmware is stuck. Ours: reset the GPU. Another ``SMU: response:``
  code: investigate.
- ``hw_init of IP block <X> failed``, ``Fatal error during GPU init`` and the lines around them
  (AMD's node-scraper lists both): the GPU did not come up. Ours: reboot first.
- ``XGMI: Failed ...``: the GPU could not join its XGMI hive. Ours: reboot.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from agent.collectors.kmsg.amdgpu_base import finding
from starpulse.core import vocab
from starpulse.core.findings import Finding

_RING_TIMEOUT_RE = re.compile(
    r"\bring (?P<ring>\S+) timeout, signaled seq=(?P<signaled>\d+), emitted seq=(?P<emitted>\d+)"
)
_RING_RESET_FAILED_RE = re.compile(r"\b[Rr]ing (?P<ring>\S+) reset failed")
_RESET_BEGIN_RE = re.compile(r"\bGPU reset begin!")
_RESET_FAILED_RE = re.compile(
    r"\bGPU reset(?:\((?P<counter>\d+)\))? failed|\b(?:[Mm]ode ?[12]|BACO) reset failed"
    r"|GPU Recovery Failed|ASIC reset failed"
)
_RESET_OK_RE = re.compile(r"\bGPU reset(?:\(\d+\))? succeeded|\bInitialized amdgpu\b")
_LOST_RE = re.compile(r"device lost from bus!|SMU: response:0x[Ff]{8}\b")
_SMU_RESPONSE_RE = re.compile(
    r"SMU: response:0x(?P<response>[0-9A-Fa-f]+) for index:(?P<index>\d+).*?message:(?P<smu_message>\w+)"
)
_SMU_STUCK_RE = re.compile(r"SMU: I'm not done with your previous command|SMU: No response|SMU is in hanged state")
_MES_RE = re.compile(r"MES failed to respon(?:d|se) (?:to )?msg=(?P<mes_msg>\w+)|MES might be in unrecoverable state")
_QCM_RE = re.compile(r"qcm fence wait loop timeout")
_KIQ_RE = re.compile(
    r"timeout waiting for kiq fence|ring (?P<ring>kiq_\S+) test failed|failed to write reg \w+ wait reg"
)
_INIT_RE = re.compile(
    r"hw_init of IP block <(?P<ip_block>\w+)> failed|Fatal error during GPU init|amdgpu_device_ip_init failed"
    r"|Failed to enable requested dpm features|Failed to setup smc hw"
)
_XGMI_RE = re.compile(r"XGMI: [Ff]ailed")

# (pattern, finding kind, action, code, what it means), tried in this order.
STARTERS: tuple[tuple[re.Pattern[str], str, str, str, str], ...] = (
    (_RESET_FAILED_RE, "accel_fault", vocab.ACTION_REBOOT, "gpu_reset_failed", "GPU reset failed"),
    (_LOST_RE, "gpu_lost", vocab.ACTION_REBOOT, "device_lost", "the GPU no longer answers on the bus"),
    (_RING_TIMEOUT_RE, "accel_fault", vocab.ACTION_RESTART_APP, "ring_timeout", "ring timeout (a hung job)"),
    (_RING_RESET_FAILED_RE, "accel_fault", vocab.ACTION_RESTART_APP, "ring_reset_failed", "ring reset failed"),
    (_RESET_BEGIN_RE, "accel_fault", vocab.ACTION_RESTART_APP, "gpu_reset", "the driver resets the GPU (hang)"),
    (_MES_RE, "accel_fault", vocab.ACTION_RESET_GPU, "mes_failed", "MES firmware does not answer"),
    (_QCM_RE, "accel_fault", vocab.ACTION_RESET_GPU, "qcm_fence_timeout", "queue preemption fence timed out"),
    (_KIQ_RE, "accel_fault", vocab.ACTION_RESET_GPU, "kiq_timeout", "KIQ does not answer"),
    (_SMU_STUCK_RE, "accel_fault", vocab.ACTION_RESET_GPU, "smu_busy", "SMU firmware does not answer"),
    (_SMU_RESPONSE_RE, "accel_fault", vocab.ACTION_INVESTIGATE, "smu_error", "SMU refused a message"),
    (_INIT_RE, "accel_fault", vocab.ACTION_REBOOT, "init_failed", "the GPU failed to initialise"),
    (_XGMI_RE, "accel_fault", vocab.ACTION_REBOOT, "xgmi_error", "XGMI hive setup failed"),
)
# Codes whose first words name the case more precisely than the table's.
_REFINE: dict[str, Callable[[str], str]] = {
    "device_lost": lambda rest: "smu_unreachable" if "SMU" in rest else "device_lost",
    "smu_busy": lambda rest: "smu_no_response" if "No response" in rest else "smu_busy",
}

# Lines that belong to a record already open on the device (consequences, repeats, progress).
_QUEUES = (
    r"The cp might be in an unrecoverable state|Failed to (?:evict|suspend|quiesce|restore) "
    r"|remove_all_kfd_queues|preemption failed"
)
_KIQ = (
    r"ring kiq_\S+ test failed|timeout waiting for kiq fence|K[GC]Q disable failed|failed to halt cp gfx"
    r"|failed to write reg"
)
_MES = (
    r"MES failed to respon|failed to remove hardware queue from MES|MES might be in unrecoverable state"
    r"|failed to unmap legacy queue"
)
_SMU = (
    r"Failed to export SMU metrics table|Failed to get current clock freq|get PPT limit failed|SMU: I'm not done"
    r"|SMU: No response|SMU is in hanged state|SMU: response:0x(?![Ff]{8})"
)
_SMU_DOWN = (
    r"SMU: response:|Failed to disable smu features|Fail to disable dpm features|Failed to switch to AC mode"
    r"|Failed to disable gfxoff"
)
_INIT = _INIT_RE.pattern + r"|finishing device"
_PROCESS = r"Process information: process|^\s*Process \S* pid \d+ thread"
FOLDS: dict[str, re.Pattern[str]] = {
    "ring_timeout": re.compile(_PROCESS),
    "gpu_reset": re.compile("|".join((_QUEUES, _KIQ, _MES, r"IP block:\S+ is hung"))),
    "gpu_reset_failed": re.compile(r"GPU reset end with ret|" + _QUEUES),
    "mes_failed": re.compile("|".join((_MES, _QUEUES))),
    "qcm_fence_timeout": re.compile("|".join((_QCM_RE.pattern, _QUEUES, _KIQ))),
    "kiq_timeout": re.compile("|".join((_QUEUES, _KIQ))),
    "smu_busy": re.compile(_SMU),
    "smu_no_response": re.compile(_SMU),
    "device_lost": re.compile("|".join((_SMU, _SMU_DOWN, _QUEUES, _KIQ, _MES, _INIT))),
    "smu_unreachable": re.compile("|".join((_SMU, _SMU_DOWN, _QUEUES, _KIQ, _MES, _INIT))),
    "init_failed": re.compile(_INIT),
    "ras_fatal": re.compile(_QUEUES),
}


def closes(rest: str) -> bool:
    """Whether the line says the device recovered (or was probed anew): its open record ends."""
    return _RESET_OK_RE.search(rest) is not None


def match_hang(message: str, rest: str, pci: str) -> Finding | None:
    """The finding a hang, reset or firmware line starts, or None."""
    for rx, kind, action, base_code, reason in STARTERS:
        m = rx.search(rest)
        if m is None:
            continue
        refine = _REFINE.get(base_code)
        code = base_code if refine is None else refine(rest)
        attrs = {"reason": reason, **{k: v for k, v in m.groupdict().items() if v}}
        return finding(kind, pci, action, code, message, attrs)
    return None
