"""NVIDIA's Xid and SXid catalogs, read once from ``starpulse/core/data/xid_catalog.yaml``.

One table, used by the agent's local findings, ``starpulse scan`` and the controller's
rules, so an Xid means the same everywhere. The data file names its source and date; this
module only gives it types and the three decodes a message needs beyond its number:
Xids 144-150 (sub-code and error status; for Xid 149's link events the link-down reason in
IntrInfo), Xid 154 (the recovery action it names) and SXids (fatal or not when the line does
not say).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

import yaml

from starpulse.core.vocab import (
    ACTION_INVESTIGATE,
    ACTION_NONE,
    ACTION_REBOOT,
    ACTION_RESET_GPU,
    ACTIONS,
    SEVERITY_ORDER,
)

UNKNOWN_BUCKET = "UNKNOWN"


@dataclass(frozen=True)
class XidInfo:
    """One catalog row: what the Xid is and what to do right away."""

    xid: int
    mnemonic: str
    description: str  # a one-line meaning
    immediate: str  # NVIDIA's immediate resolution bucket ("" where NVIDIA gives none)
    action: str  # our action for that bucket
    severity: str  # info | warning | critical | fatal
    in_use: bool = True  # False where NVIDIA's table says "Unused"


@dataclass(frozen=True)
class Nvlink5Decode:
    """One row of NVIDIA's Xid 144-150 decode sheet."""

    xid: int
    subcodes: tuple[str, ...]
    status: int | None  # the error status; None: every status of the sub-code
    bucket: str
    severity: str  # as the sheet writes it: "Fatal", "Non-fatal", "Link Fatal"

    @property
    def fatal(self) -> bool:
        """Whether the sheet calls it fatal (to the GPU or the link)."""
        return self.severity.lower().startswith(("fatal", "link fatal"))


@dataclass(frozen=True)
class LinkDownDecode:
    """One Xid 149 NETIR_LINK_EVT row of the decode sheet, by its link-down reason."""

    reason: int  # IntrInfo bits 25:20
    bucket: str
    severity: str  # as the sheet writes it ("Link Fatal", "Fatal", "Link Fatal?")
    investigate: str  # the sheet's Investigatory column

    @property
    def fatal(self) -> bool:
        return self.severity.lower().startswith(("fatal", "link fatal"))


@dataclass(frozen=True)
class SxidInfo:
    """An NVSwitch SXid's class, as far as a public source gives it."""

    sxid: int
    fatal: bool
    description: str
    source: str
    klass: str = ""  # the guide's table: non_fatal, fatal, always_fatal or notable
    action: str = ""  # a non-fatal code's recovery where the guide asks for more than a look


@dataclass(frozen=True)
class _Catalog:
    buckets: dict[str, str]
    xids: dict[int, XidInfo]
    nvlink5: tuple[Nvlink5Decode, ...]
    recovery: dict[str, str]
    sxids: dict[int, SxidInfo]
    link_down: dict[int, LinkDownDecode]
    source: str
    date: str


def _load_raw() -> dict[str, Any]:
    text = resources.files("starpulse.core.data").joinpath("xid_catalog.yaml").read_text(encoding="utf-8")
    raw = yaml.safe_load(text)
    if not isinstance(raw, dict):
        raise ValueError("starpulse/core/data/xid_catalog.yaml: expected a mapping")
    return raw


def _check_action(action: str, where: str) -> str:
    if action not in ACTIONS:
        raise ValueError(f"starpulse/core/data/xid_catalog.yaml: {where}: unknown action {action!r}")
    return action


@cache
def _catalog() -> _Catalog:
    raw = _load_raw()
    buckets = {str(k): _check_action(str(v), f"buckets.{k}") for k, v in raw["buckets"].items()}
    xids: dict[int, XidInfo] = {}
    for row in raw["xids"]:
        code = int(row["code"])
        severity = str(row["severity"])
        if severity not in SEVERITY_ORDER:
            raise ValueError(f"starpulse/core/data/xid_catalog.yaml: xid {code}: unknown severity {severity!r}")
        xids[code] = XidInfo(
            xid=code,
            mnemonic=str(row["mnemonic"]),
            description=str(row["meaning"]),
            immediate=str(row["bucket"] or ""),
            action=_check_action(str(row["action"]), f"xid {code}"),
            severity=severity,
            in_use=bool(row.get("in_use", True)),
        )
    nvlink5 = tuple(
        Nvlink5Decode(
            xid=int(r["xid"]),
            subcodes=tuple(str(s) for s in r["subcodes"]),
            status=None if r["status"] is None else int(r["status"]),
            bucket=str(r["bucket"]),
            severity=str(r["severity"]),
        )
        for r in raw["nvlink5_decode"]
    )
    recovery = {str(k): _check_action(str(v), f"recovery_actions.{k}") for k, v in raw["recovery_actions"].items()}
    sxids = {
        int(r["code"]): SxidInfo(
            int(r["code"]),
            bool(r["fatal"]),
            str(r["meaning"]),
            str(r["source"]),
            str(r.get("class", "")),
            _check_action(str(r["action"]), f"sxid {r['code']}") if r.get("action") else "",
        )
        for r in raw["sxids"]
    }
    link_down = {
        int(r["reason"]): LinkDownDecode(int(r["reason"]), str(r["bucket"]), str(r["severity"]), str(r["investigate"]))
        for r in raw["nvlink5_link_down"]
    }
    return _Catalog(buckets, xids, nvlink5, recovery, sxids, link_down, str(raw["source"]), str(raw["date"]))


CATALOG: dict[int, XidInfo] = _catalog().xids
SOURCE: str = _catalog().source
SNAPSHOT_DATE: str = _catalog().date


def bucket_action(bucket: str) -> str:
    """Our action for one of NVIDIA's resolution buckets (investigate for one we do not know)."""
    return _catalog().buckets.get(bucket, ACTION_INVESTIGATE)


def lookup(xid: int) -> XidInfo:
    """The catalog row for an Xid; unknown Xids are a warning to investigate, never ignored."""
    info = CATALOG.get(xid)
    if info is not None:
        return info
    return XidInfo(xid, "UNKNOWN", f"Xid {xid} (not in the catalog)", UNKNOWN_BUCKET, ACTION_INVESTIGATE, "warning")


# Buckets whose action is in the message, not the number: the agent decodes it into the event.
MESSAGE_DECODED_BUCKETS = frozenset({"WORKFLOW_NVLINK5_ERR", "XID_154"})


def rule_action(xid: int, event_action: str = "") -> str:
    """The action an Xid event files under: the catalog's, or for 144-150 and 154 the one the
    agent decoded from the message (a non-fatal 145 is not a reset; 154 names its own)."""
    info = lookup(xid)
    if info.immediate in MESSAGE_DECODED_BUCKETS and event_action in ACTIONS:
        return event_action
    return info.action


def decode_nvlink5(xid: int, subcode: str, status: int | None) -> Nvlink5Decode | None:
    """The decode-sheet row for an Xid 144-150 message, or None where no public decode has it."""
    for row in _catalog().nvlink5:
        if row.xid != xid or subcode not in row.subcodes:
            continue
        if row.status is None or row.status == status:
            return row
    return None


# Xid 149's link-event sub-codes (V1 and V2 names), decoded by the link-down reason.
LINK_DOWN_SUBCODES = frozenset({"NETIR_LINK_EVT", "NETIR_LINK_DOWN"})


def link_down_reason(intr_info: int) -> int:
    """The link-down reason an Xid 149 link event carries: IntrInfo bits 25:20."""
    return (intr_info >> 20) & 0x3F


def decode_link_down(reason: int) -> LinkDownDecode | None:
    """The decode-sheet row for a link-down reason, or None where the sheet lists none."""
    return _catalog().link_down.get(reason)


def named_recovery_action(words: str) -> str | None:
    """Our action for the words Xid 154 uses ("GPU Reset Required" -> reset_gpu); None if unknown."""
    return _catalog().recovery.get(words.strip())


def sxid_info(sxid: int) -> SxidInfo | None:
    """The SXid's class where a public source gives one."""
    return _catalog().sxids.get(sxid)


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
