"""Ascend DCMI fault codes to starpulse actions, through MindCluster's handling levels.

Huawei's MindCluster files every DCMI fault code under one handling level (the device plugin's
``faultCode.json``). The product's table ships with the agent, re-expressed as facts (level ->
codes, the source named inside): ``ascend_fault_levels.json``, used by default, so each code's
documented handling decides the action. An operator may point ``fault_codes`` of the Ascend
backend at another table: that shape, or a ``codes`` list of ``{"code", "mindcluster_level"}``
rows. What is ours is the mapping of each level to an action, below. A code the table does not
hold is handled as MindCluster documents for unknown codes: by the chip's health, a Warning
needing nothing, anything worse SeparateNPU.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

from starpulse.core import vocab

# MindCluster level -> starpulse action, most severe last within equal severity.
LEVEL_ACTION: dict[str, str] = {
    "NotHandleFault": vocab.ACTION_NONE,  # no service impact
    "RestartRequest": vocab.ACTION_RESTART_APP,  # re-run the request / training
    "RestartBusiness": vocab.ACTION_RESTART_APP,  # re-run the service
    "SubHealthFault": vocab.ACTION_INVESTIGATE,  # per the job's sub-health strategy
    "PreSeparateNPU": vocab.ACTION_INVESTIGATE,  # no new jobs on the chip
    "FreeRestartNPU": vocab.ACTION_RESET_GPU,  # reset the chip when idle
    "RestartNPU": vocab.ACTION_RESET_GPU,  # reset the chip now
    "SeparateNPU": vocab.ACTION_CONTACT_SUPPORT,  # unrecoverable: isolate the chip
}
UNKNOWN_CODE_LEVEL = "SeparateNPU"
# MindCluster's table as shipped with the agent (see the file's "source").
DEFAULT_TABLE = Path(__file__).with_name("ascend_fault_levels.json")


class FaultCodeError(ValueError):
    """The fault-code table cannot be used; one line naming the file."""


def load_fault_levels(path: str | Path) -> dict[str, str]:
    """Code (upper case) -> MindCluster level, from a faultCode table file."""
    where = Path(path)
    try:
        data = json.loads(where.read_text())
        levels = _levels_of(data)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise FaultCodeError(f"{where}: not a fault-code table ({exc.__class__.__name__}: {exc})") from None
    unknown = sorted({lvl for lvl in levels.values() if lvl not in LEVEL_ACTION})
    if unknown:
        raise FaultCodeError(f"{where}: levels {', '.join(unknown)} have no action")
    return levels


def _levels_of(data: dict[str, Any]) -> dict[str, str]:
    """Code -> level from either table shape: ``codes`` rows, or ``levels`` (level -> list of codes)."""
    if "codes" in data:
        # A row without a level is a code the device plugin does not list: an unknown code.
        rows = data["codes"]
        return {str(r["code"]).upper(): str(r["mindcluster_level"]) for r in rows if r.get("mindcluster_level")}
    levels = data["levels"]
    if not all(isinstance(codes, list) for codes in levels.values()):
        raise TypeError("'levels' must map each level to a list of codes")
    return {str(c).upper(): str(level) for level, codes in levels.items() for c in codes}


@cache
def default_levels() -> dict[str, str]:
    """MindCluster's table shipped with the agent (read once; callers must not change it)."""
    return load_fault_levels(DEFAULT_TABLE)


def level_of(code: str, levels: dict[str, str], health: str) -> str:
    """The MindCluster level of ``code``; an unknown code by the chip's health grade."""
    known = levels.get(code.upper())
    if known is not None:
        return known
    return "NotHandleFault" if health in ("ok", "warning") else UNKNOWN_CODE_LEVEL


def action_of(code: str, levels: dict[str, str], health: str) -> str:
    return LEVEL_ACTION[level_of(code, levels, health)]


def worst_action(actions: list[str]) -> str:
    """The action of the most severe fault among several (ties: the later, more drastic verb)."""
    return max(actions, key=lambda a: (vocab.SEVERITY_ORDER[vocab.severity_for_action(a)], vocab.ACTIONS.index(a)))
