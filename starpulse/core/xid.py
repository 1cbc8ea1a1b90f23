"""NVIDIA's Xid catalog (Ampere and newer), reduced to what a health daemon acts on.

Source: NVIDIA "Analyzing Xid Errors with the Xid Catalog", resolution buckets as
snapshotted on 2025-10-29 (via leptonai/gpud's generated catalog). One table, used
by both the agent's local findings and the controller's rules, so an Xid means the
same thing everywhere.
"""

from __future__ import annotations

from dataclasses import dataclass

from starpulse.core.vocab import (
    ACTION_CONTACT_SUPPORT,
    ACTION_INVESTIGATE,
    ACTION_NONE,
    ACTION_REBOOT,
    ACTION_RESET_GPU,
    ACTION_RESTART_APP,
    severity_for_action,
)


@dataclass(frozen=True)
class XidInfo:
    """One catalog row: what the Xid is and what to do right away."""

    xid: int
    mnemonic: str
    description: str
    immediate: str  # NVIDIA's immediate resolution bucket
    action: str  # our action for that bucket
    severity: str  # info | warning | critical | fatal


_BUCKET_ACTION = {
    "IGNORE": ACTION_NONE,
    "RESTART_APP": ACTION_RESTART_APP,
    "RESET_GPU": ACTION_RESET_GPU,
    "RESTART_BM": ACTION_REBOOT,
    "CONTACT_SUPPORT": ACTION_CONTACT_SUPPORT,
    "WORKFLOW_XID_45": ACTION_NONE,  # cleanup after another Xid: follow that one
    "WORKFLOW_XID_48": ACTION_RESET_GPU,  # DBE: check remapped rows; pending -> reset
    "WORKFLOW_NVLINK_ERR": ACTION_RESET_GPU,
    "WORKFLOW_NVLINK5_ERR": ACTION_RESET_GPU,
    "XID_154": ACTION_INVESTIGATE,  # act on the recovery action it names
}

_ROWS: tuple[tuple[int, str, str, str], ...] = (
    (13, "GR_EXCEPTION", "Graphics engine exception", "RESTART_APP"),
    (31, "FIFO_ERROR_MMU_ERR_FLT", "GPU memory page fault", "RESTART_APP"),
    (43, "RESETCHANNEL_VERIF_ERROR", "GPU stopped processing", "IGNORE"),
    (45, "PREEMPTIVE_REMOVAL", "Preemptive cleanup after earlier errors", "WORKFLOW_XID_45"),
    (46, "GPU_TIMEOUT_ERROR", "GPU timeout", "RESET_GPU"),
    (48, "GPU_ECC_DBE", "Double-bit ECC error", "WORKFLOW_XID_48"),
    (61, "PMU_BREAKPOINT", "Internal micro-controller breakpoint", "CONTACT_SUPPORT"),
    (62, "PMU_HALT_ERROR", "Internal micro-controller halt", "RESET_GPU"),
    (63, "INFOROM_DRAM_RETIREMENT_EVENT", "Row remap / page retirement event", "IGNORE"),
    (64, "INFOROM_DRAM_RETIREMENT_FAILURE", "Row remap / page retirement failure", "RESET_GPU"),
    (68, "NVDEC0_EXCEPTION", "Video decoder exception", "RESTART_APP"),
    (69, "GR_CLASS_ERROR", "Graphics engine class error", "RESTART_APP"),
    (74, "NVLINK_ERROR", "NVLink error", "WORKFLOW_NVLINK_ERR"),
    (79, "GPU_HAS_FALLEN_OFF_THE_BUS", "GPU has fallen off the bus", "RESTART_BM"),
    (92, "EXCESSIVE_SBE_INTERRUPTS", "High single-bit ECC error rate", "IGNORE"),
    (94, "CONTAINED_ERROR", "Contained memory error", "RESTART_APP"),
    (95, "UNCONTAINED_ERROR", "Uncontained memory error", "RESET_GPU"),
    (109, "CTXSW_TIMEOUT_ERROR", "Context switch timeout", "RESET_GPU"),
    (119, "GSP_RPC_TIMEOUT", "GSP RPC timeout", "RESET_GPU"),
    (120, "GSP_ERROR", "GSP error", "RESET_GPU"),
    (121, "C2C_ERROR", "C2C link error", "IGNORE"),
    (140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", "Unrecoverable ECC error escape", "RESET_GPU"),
    (143, "GPU_INIT_ERROR", "GPU initialization error", "RESET_GPU"),
    (144, "NVLINK_SAW_ERROR", "NVLink5 SAW error", "WORKFLOW_NVLINK5_ERR"),
    (145, "NVLINK_RLW_ERROR", "NVLink5 RLW error", "WORKFLOW_NVLINK5_ERR"),
    (146, "NVLINK_TLW_ERROR", "NVLink5 TLW error", "WORKFLOW_NVLINK5_ERR"),
    (147, "NVLINK_TREX_ERROR", "NVLink5 TREX error", "WORKFLOW_NVLINK5_ERR"),
    (148, "NVLINK_NVLPW_CTRL_ERROR", "NVLink5 NVLPW control error", "WORKFLOW_NVLINK5_ERR"),
    (149, "NVLINK_NETIR_ERROR", "NVLink5 NETIR error", "WORKFLOW_NVLINK5_ERR"),
    (150, "NVLINK_MSE_ERROR", "NVLink5 MSE watchdog", "WORKFLOW_NVLINK5_ERR"),
    (154, "GPU_RECOVERY_ACTION_CHANGED", "GPU recovery action changed", "XID_154"),
    (155, "NVLINK_SW_DEFINED_ERROR", "NVLink software-defined error", "RESET_GPU"),
    (158, "GPU_FATAL_TIMEOUT", "GPU fatal timeout", "RESET_GPU"),
)

CATALOG: dict[int, XidInfo] = {
    xid: XidInfo(
        xid=xid,
        mnemonic=mnemonic,
        description=description,
        immediate=bucket,
        action=_BUCKET_ACTION[bucket],
        severity=severity_for_action(_BUCKET_ACTION[bucket]),
    )
    for xid, mnemonic, description, bucket in _ROWS
}

# Xid 48 (DBE) is always at least critical even though its bucket is a workflow.
CATALOG[48] = XidInfo(48, "GPU_ECC_DBE", "Double-bit ECC error", "WORKFLOW_XID_48", ACTION_RESET_GPU, "critical")


def lookup(xid: int) -> XidInfo:
    """The catalog row for an Xid; unknown Xids are a warning to investigate, never ignored."""
    info = CATALOG.get(xid)
    if info is not None:
        return info
    return XidInfo(xid, "UNKNOWN", f"Xid {xid} (not in the catalog)", "UNKNOWN", ACTION_INVESTIGATE, "warning")


# NVML_FI_DEV_GET_GPU_RECOVERY_ACTION values -> our action.
RECOVERY_ACTIONS: dict[int, tuple[str, str]] = {
    0: ("NONE", ACTION_NONE),
    1: ("GPU_RESET", ACTION_RESET_GPU),
    2: ("NODE_REBOOT", ACTION_REBOOT),
    3: ("DRAIN_P2P", ACTION_RESET_GPU),
    4: ("DRAIN_AND_RESET", ACTION_RESET_GPU),
    5: ("RECOVER_IMEX_DOMAIN", ACTION_INVESTIGATE),
    6: ("BUS_RESET", ACTION_RESET_GPU),
    7: ("SYSTEM_REBOOT", ACTION_REBOOT),
}


def recovery_action(value: int) -> tuple[str, str]:
    """(name, action) for a recovery-action field value."""
    return RECOVERY_ACTIONS.get(value, (f"UNKNOWN_{value}", ACTION_INVESTIGATE))
