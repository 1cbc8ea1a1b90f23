"""The policy file's shape, declared for the settings schema, and the Policy it becomes.

Every key of ``default_policy.yaml`` (kinds, agent_commands, escalation and the repair
ladder) is a field here with its type, bounds and choices; ``starpulse.core.schema`` reads a
file against it and reports every problem at once, one line each with the file and the dotted
key (``p.yaml: kinds.gpu_fault.by_xid.79: must be one of alert_only, ..., got 'rset'``). What
a schema cannot say (a kind the correlator does not call evictable asked to evict, a ladder
that does not end in ``retire``, a regex that does not compile) is each dataclass's
``problems()``, reported through the same list. The building below only converts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

from controller.heal.ladder import (
    DIAG_NAME,
    PASS_KINDS,
    RETIRE,
    RETURN_TO,
    RUNGS,
    SPARE_SHARE_PCT,
    Diagnostic,
    Lemon,
    RepairPolicy,
    Validation,
)
from starpulse.core.schema import Schema, meta, section, setting
from starpulse.core.vocab import EVICTABLE_KINDS, SEVERITY_ORDER

ACTIONS: tuple[str, ...] = ("alert_only", "cordon", "evict", "reset_gpu", "reboot", "rma")
AGENT_COMMANDS: tuple[str, ...] = ("reset_gpu", "reboot")
NEVER_EVICT_KINDS: frozenset[str] = frozenset({"switch_fault", "link_fault", "path_fault", "partition", "node_down"})
SEVERITIES: tuple[str, ...] = tuple(SEVERITY_ORDER)
_TIME = ("time",)

Problems = list[tuple[str, str]]


@dataclass(frozen=True)
class MatchKeys:
    """Any-of matcher: the incident's action, its severity, rules or Xids in its evidence."""

    actions: list[str] = setting([], "Incident actions (the Xid catalog's vocabulary)")
    rules: list[str] = setting([], "Rule ids in the incident's evidence")
    severities: list[str] = setting([], "Incident severities", choices=SEVERITIES)
    xids: list[int] = setting([], "Xids in the incident's evidence")


@dataclass(frozen=True)
class CheckpointKeys:
    """Checkpoint first when ``when`` matches and ``unless`` does not."""

    when: MatchKeys | None = setting(None, "When to checkpoint (required: use true for always)")
    unless: MatchKeys | None = setting(None, "When not to, whatever ``when`` says")

    def problems(self) -> Problems:
        return [("when", "is required (use true for always)")] if self.when is None else []


@dataclass(frozen=True)
class KindKeys:
    """What to do about one incident kind."""

    action: str = field(metadata=meta("The action", choices=ACTIONS))
    min_severity: str = setting("info", "Below it: alert_only", choices=SEVERITIES)
    checkpoint_first: bool | CheckpointKeys = setting(False, "Ask the job to checkpoint before evicting")
    by_action: dict[str, str] = setting({}, "Action by the incident's recommended action", choices=ACTIONS)
    by_xid: dict[str, str] = setting(
        {}, "Action by an Xid in the evidence ('unknown': uncatalogued)", choices=ACTIONS, number_keys=True
    )

    def problems(self) -> Problems:
        return [
            (f"by_xid.{k}", "must be an Xid number or 'unknown'")
            for k in self.by_xid
            if k != "unknown" and not k.isdigit()
        ]

    def problems_as(self, kind: str) -> Problems:
        """A kind the correlator does not call evictable only ever gets alert_only."""
        wanted = {self.action, *self.by_action.values(), *self.by_xid.values()} - {"alert_only"}
        if kind in EVICTABLE_KINDS or not wanted:
            return []
        why = (
            "the node is not the culprit" if kind in NEVER_EVICT_KINDS else "the correlator does not call it evictable"
        )
        return [("", f"{kind} may only be alert_only ({why}), got {', '.join(sorted(wanted))}")]


@dataclass(frozen=True)
class SameGpuKeys:
    """The same GPU with this many serious incidents in the window goes to ``action``."""

    count: int = setting(3, "Serious incidents on one GPU", ge=1)
    window: float = setting(86400.0, "Counted over this span", quantity=_TIME, gt=0)
    min_severity: str = setting("critical", "Incidents at least this severe count", choices=SEVERITIES)
    action: str = setting("rma", "What then", choices=ACTIONS)


@dataclass(frozen=True)
class EscalationKeys:
    same_gpu_fatal_xid: SameGpuKeys = section(SameGpuKeys)
    max_repair_loops: int = setting(2, "Repairs before a node goes to repair_loop_action", ge=1)
    repair_loop_action: str = setting("rma", "What a node past max_repair_loops gets", choices=ACTIONS)


@dataclass(frozen=True)
class DiagnosticKeys:
    """One check the node's agent runs before a repaired node returns."""

    name: str = field(metadata=meta("The agent's configured name", pattern=DIAG_NAME.pattern))
    timeout: float = setting(600.0, "Its time limit", quantity=_TIME, ge=0)
    passes: str = setting("exit_ok", "How its output is read: " + ", ".join(PASS_KINDS), file_key="pass")
    args: str = setting("", "Passed to the agent's template as {args}")

    def problems(self) -> Problems:
        if self.passes.startswith("regex:"):
            try:
                re.compile(self.passes[6:])
            except re.error as err:
                return [("pass", f"bad regex: {err}")]
        elif self.passes not in ("exit_ok", "dcgmi"):
            return [("pass", f"must be one of {', '.join(PASS_KINDS)}, got {self.passes!r}")]
        return []


@dataclass(frozen=True)
class ValidationKeys:
    scan_clean: bool = setting(True, "Its incident's conditions resolved, no other incident open on it")
    clear_within: float = setting(300.0, "How long the repaired node gets for that", quantity=_TIME, ge=0)
    evidence_quiet: float = setting(120.0, "Then nothing new for this long", quantity=_TIME, ge=0)
    diagnostics: list[DiagnosticKeys] = setting([], "Run by the node's agent, in order")


@dataclass(frozen=True)
class TimeoutKeys:
    reset_gpu: float = setting(600.0, "Past this a GPU reset counts as failed", quantity=_TIME, ge=0)
    reboot: float = setting(1200.0, "Past this a reboot counts as failed", quantity=_TIME, ge=0)


@dataclass(frozen=True)
class LemonKeys:
    window: float = setting(7 * 86400.0, "Returns within this span count", quantity=_TIME, ge=0)
    retire_after_returns: int = setting(3, "Returns in the window that retire a node", ge=1)


@dataclass(frozen=True)
class RepairKeys:
    """After the eviction: the repair ladder, validation and return (controller/heal/ladder.py)."""

    ladders: dict[str, list[str]] | None = setting(None, "Rungs a node climbs, per incident kind", choices=RUNGS)
    timeouts: TimeoutKeys = section(TimeoutKeys)
    validation: dict[str, ValidationKeys] | None = setting(None, "What must hold before a node returns, per kind")
    return_to: str = setting("spare", "Where validated nodes go", choices=RETURN_TO)
    spare_share: float = setting(
        SPARE_SHARE_PCT,
        "Validated nodes refill the pool to this share of the fleet's compute nodes, rounded up, at least 1 "
        "(0%: no pool). Set by measurement: the smallest share at which the fleet simulator's job spanning "
        "the fleet never waited for capacity on the Llama 3 mix (bench/README.md, issue 28)",
        quantity=("percent",),
        ge=0,
        le=100,
    )
    spare_target: int | None = setting(
        None, "An absolute number of spares instead of spare_share (it wins when set); null: use the share", ge=0
    )
    lemon: LemonKeys = section(LemonKeys)

    def problems(self) -> Problems:
        why = f"the last rung must be {RETIRE!r}, so a node that never passes is taken out"
        return [(f"ladders.{kind}", why) for kind, rungs in (self.ladders or {}).items() if rungs[-1] != RETIRE]


@dataclass(frozen=True)
class PolicyFile:
    """The whole file."""

    version: Literal[1] = field(metadata=meta("The policy format's version"))
    kinds: dict[str, KindKeys] = field(metadata=meta("Incident kind -> its policy", nonempty=True))
    agent_commands: list[str] = setting(
        list(AGENT_COMMANDS), "Commands the controller may ask an agent to run", choices=AGENT_COMMANDS
    )
    escalation: EscalationKeys = section(EscalationKeys)
    repair: RepairKeys = section(RepairKeys)


SCHEMA = Schema(PolicyFile, "policy")


def repair_policy(r: RepairKeys) -> RepairPolicy:
    """The checked ``repair:`` section over the defaults (a ladder or validation not named keeps its default)."""
    default = RepairPolicy()
    validations = {
        kind: Validation(
            v.scan_clean,
            v.evidence_quiet,
            tuple(Diagnostic(d.name, d.timeout, d.passes, d.args) for d in v.diagnostics),
            v.clear_within,
        )
        for kind, v in (r.validation or {}).items()
    }
    return RepairPolicy(
        {**default.ladders, **{k: tuple(v) for k, v in (r.ladders or {}).items()}},
        {"reset_gpu": r.timeouts.reset_gpu, "reboot": r.timeouts.reboot},
        {**default.validations, **validations},
        r.return_to,
        Lemon(r.lemon.window, r.lemon.retire_after_returns),
        r.spare_target,
        r.spare_share,
    )
