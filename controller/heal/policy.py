"""Self-healing policy as data: what to do about each incident kind.

Why data: the right response to an Xid differs between fleets (one site resets GPUs,
another never reboots unattended); operators tune a YAML file, not code. The file is
validated in full at load with one line per problem (file, key, what is wrong).

Schema (``default_policy.yaml`` is the annotated reference)::

    version: 1
    kinds:
      <incident kind>:
        action: alert_only | cordon | evict | reset_gpu | reboot | rma
        min_severity: info | warning | critical | fatal     # below it: alert_only
        checkpoint_first: true | false | {when: MATCH, unless: MATCH}
        by_action: {<incident action>: <action>}             # e.g. reboot: reboot
        by_xid: {<xid number> | unknown: <action>}           # wins over by_action; "unknown": an
                                                             # Xid not in NVIDIA's catalog
    agent_commands: [reset_gpu, reboot]                      # may be requested from agents
    escalation:
      same_gpu_fatal_xid: {count: 3, window: 24h, min_severity: critical, action: rma}
      max_repair_loops: 2
      repair_loop_action: rma
    repair: {ladders, timeouts, validation, return_to, lemon}  # after the eviction: ladder.py
    # MATCH: {actions: [...], rules: [...], severities: [...], xids: [...]}; matches when any
    # listed item is present (the incident's action, a rule / Xid of its evidence, its severity).

Hard rule: kinds the correlator does not call evictable (switch_fault, link_fault,
partition, node_down, other...) only ever get ``alert_only``; the loader refuses anything
else for them and ``decide`` asserts it whatever the file says.

Escalation counts serious GPU incidents per GPU (root cause) in SQLite so it survives a
restart. It counts incidents, not events: a recurrence the correlator folds into the same
incident (same id, flap damping) counts once.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

import structlog
import yaml

from controller.detect.model import Incident
from controller.heal.ladder import RepairPolicy
from controller.heal.policy_file import (
    ACTIONS,
    AGENT_COMMANDS,
    NEVER_EVICT_KINDS,
    SCHEMA,
    KindKeys,
    MatchKeys,
    repair_policy,
)
from controller.heal.states import RemediationStore
from controller.store import transaction
from starpulse.core import vocab
from starpulse.core import xid as xidcat
from starpulse.core.clock import Clock
from starpulse.core.schema import ConfigError, Reading
from starpulse.core.vocab import SEVERITY_ORDER

log = structlog.get_logger(__name__)

SUPPORTED_VERSION = 1
DEFAULT_POLICY_FILE = "default_policy.yaml"

ALERT_ONLY = "alert_only"
CORDON = "cordon"
EVICT = "evict"
RESET_GPU = "reset_gpu"
REBOOT = "reboot"
RMA = "rma"
assert (ALERT_ONLY, CORDON, EVICT, RESET_GPU, REBOOT, RMA) == ACTIONS  # least to most disruptive
EVICTING_ACTIONS: frozenset[str] = frozenset({EVICT, RESET_GPU, REBOOT, RMA})
"""Actions that move jobs off the node (reset/reboot/rma all start with an eviction)."""


class PolicyError(ConfigError):
    """A policy file that cannot be used; ``errors`` holds one line per problem."""


@dataclass(frozen=True)
class Match:
    """Any-of matcher on an incident: its action, its severity, evidence rules or Xids."""

    actions: frozenset[str] = frozenset()
    rules: frozenset[str] = frozenset()
    severities: frozenset[str] = frozenset()
    xids: frozenset[int] = frozenset()

    def matches(self, incident: Incident) -> bool:
        if incident.action in self.actions or incident.severity in self.severities:
            return True
        return bool(self.rules & set(evidence_rules(incident)) or self.xids & set(evidence_xids(incident)))


@dataclass(frozen=True)
class Checkpoint:
    """When to ask the job to checkpoint before evicting: ``when`` matches and ``unless`` does not."""

    always: bool = False
    when: Match | None = None
    unless: Match | None = None

    def wanted(self, incident: Incident) -> bool:
        if self.unless is not None and self.unless.matches(incident):
            return False
        return self.always or (self.when is not None and self.when.matches(incident))


@dataclass(frozen=True)
class KindPolicy:
    action: str = ALERT_ONLY
    min_severity: str = "info"
    checkpoint: Checkpoint = field(default_factory=Checkpoint)
    by_action: dict[str, str] = field(default_factory=dict)
    by_xid: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Escalation:
    same_gpu_count: int = 3
    same_gpu_window_s: float = 86400.0
    same_gpu_min_severity: str = "critical"
    same_gpu_action: str = RMA
    max_repair_loops: int = 2
    repair_loop_action: str = RMA


@dataclass(frozen=True)
class Decision:
    """What the policy wants done about one incident (before the guards)."""

    action: str
    checkpoint_first: bool
    reason: str
    escalated: bool = False
    node: str | None = None  # the node the action is for (None: alert only, or no single node)

    @property
    def evicts(self) -> bool:
        return self.action in EVICTING_ACTIONS

    @property
    def touches_node(self) -> bool:
        """Whether the action takes the node (or part of it) out of service."""
        return self.action != ALERT_ONLY


class HealHistory(Protocol):
    """What ``Policy.decide`` needs to know about the past."""

    def record_fault(self, incident: Incident) -> None:
        """Count a serious GPU incident for its GPU (idempotent per incident id)."""

    def fault_count(self, component: str, window_s: float) -> int:
        """Serious incidents counted for ``component`` within the last ``window_s``."""

    def repair_loops(self, node: str) -> int:
        """Times the node has been through repair."""


class SqliteHealHistory:
    """``HealHistory`` on the controller's SQLite connection (table ``heal_gpu_faults``)."""

    def __init__(self, store: RemediationStore, clock: Clock) -> None:
        self._store = store
        self._db: sqlite3.Connection = store.conn
        self.clock = clock
        self._clock = self.clock.time_ms
        self._db.executescript(
            """CREATE TABLE IF NOT EXISTS heal_gpu_faults (
                   component TEXT NOT NULL,
                   incident_id TEXT NOT NULL,
                   node TEXT,
                   severity TEXT NOT NULL,
                   at_ms INTEGER NOT NULL,
                   PRIMARY KEY (component, incident_id)
               );
               CREATE INDEX IF NOT EXISTS heal_gpu_faults_at ON heal_gpu_faults(component, at_ms);"""
        )

    def record_fault(self, incident: Incident) -> None:
        with transaction(self._db):
            self._db.execute(
                "INSERT OR IGNORE INTO heal_gpu_faults(component, incident_id, node, severity, at_ms) "
                "VALUES (?, ?, ?, ?, ?)",
                (incident.root_cause, incident.id, target_node(incident), incident.severity, self._clock()),
            )

    def fault_count(self, component: str, window_s: float) -> int:
        since = self._clock() - int(window_s * 1000)
        row = self._db.execute(
            "SELECT COUNT(*) FROM heal_gpu_faults WHERE component = ? AND at_ms > ?", (component, since)
        ).fetchone()
        return int(row[0])

    def repair_loops(self, node: str) -> int:
        return self._store.repair_loops(node)


def evidence_rules(incident: Incident) -> list[str]:
    return [str(e["rule"]) for e in incident.evidence if isinstance(e, dict) and e.get("rule")]


# The by_xid key for "an Xid not in NVIDIA's catalog" (no Xid is numbered 0).
UNKNOWN_XID = 0


def _xid_key(by_xid: dict[int, str], xid: int) -> int | None:
    """The by_xid entry that applies to ``xid``: its own, else "unknown" for an uncatalogued one."""
    if xid in by_xid:
        return xid
    if UNKNOWN_XID in by_xid and xid not in xidcat.CATALOG:
        return UNKNOWN_XID
    return None


def evidence_xids(incident: Incident) -> list[int]:
    out: list[int] = []
    for e in incident.evidence:
        inner = e.get("evidence") if isinstance(e, dict) else None
        if isinstance(inner, dict) and isinstance(inner.get("xid"), int):
            out.append(int(inner["xid"]))
    return out


def target_node(incident: Incident) -> str | None:
    """The one node an incident blames: the root cause's node ("node-003/gpu-5" -> "node-003").

    None for incidents that blame no node (partitions) or several nodes without a node root cause.
    """
    if incident.root_cause and incident.component_type in ("gpu", "nic", "node"):
        return incident.root_cause.split("/", 1)[0]
    if len(incident.affected_nodes) == 1 and incident.component_type in ("gpu", "nic", "node"):
        return incident.affected_nodes[0]
    return None


def _rank(action: str) -> int:
    return ACTIONS.index(action)


@dataclass(frozen=True)
class Policy:
    kinds: dict[str, KindPolicy]
    agent_commands: frozenset[str]
    escalation: Escalation
    source: str = "<policy>"
    repair: RepairPolicy = field(default_factory=RepairPolicy)  # what happens after the eviction

    def decide(self, incident: Incident, history: HealHistory | None = None) -> Decision:
        """The action for ``incident``; ``history`` (when given) feeds escalation.

        Deterministic and idempotent: deciding the same incident twice counts it once
        towards same-GPU escalation.
        """
        decision = self._decide(incident, history)
        if not vocab.may_evict(incident.kind):
            assert decision.action == ALERT_ONLY, f"policy produced {decision.action} for {incident.kind}"
        log.info(
            "heal_decision",
            incident=incident.id,
            kind=incident.kind,
            node=decision.node,
            action=decision.action,
            checkpoint_first=decision.checkpoint_first,
            escalated=decision.escalated,
            reason=decision.reason,
        )
        return decision

    def holds(self, incident: Incident, node: str) -> bool:
        """Whether ``incident`` keeps ``node`` out of service: it blames the node and this policy
        acts on it. A switch fault the node only sits under, or an alert-only note on the node
        (an application's Xid 13), neither bars its return nor makes a spare unusable."""
        return target_node(incident) == node and self._decide(incident, None).action != ALERT_ONLY

    def _decide(self, incident: Incident, history: HealHistory | None) -> Decision:
        kind = incident.kind
        if kind in NEVER_EVICT_KINDS or not vocab.may_evict(incident.kind):
            return Decision(ALERT_ONLY, False, f"{kind}: the node is not the culprit; alert only, never evict")
        node = target_node(incident)
        rule = self.kinds.get(kind)
        if rule is None:
            return Decision(ALERT_ONLY, False, f"no policy for {kind}", node=node)
        if SEVERITY_ORDER.get(incident.severity, 0) < SEVERITY_ORDER[rule.min_severity]:
            return Decision(
                ALERT_ONLY, False, f"{kind} severity {incident.severity} below {rule.min_severity}", node=node
            )
        action, why = rule.action, f"{kind} -> {rule.action}"
        xid_hits = [(x, rule.by_xid[k]) for x in evidence_xids(incident) if (k := _xid_key(rule.by_xid, x)) is not None]
        if xid_hits:
            x, action = max(xid_hits, key=lambda h: (_rank(h[1]), h[0]))
            why = f"{kind} with Xid {x} -> {action}"
        elif incident.action in rule.by_action:
            action = rule.by_action[incident.action]
            why = f"{kind} recommending {incident.action} -> {action}"
        escalated = False
        esc = self.escalation
        if (
            history is not None
            and kind == "gpu_fault"
            and incident.root_cause
            and SEVERITY_ORDER.get(incident.severity, 0) >= SEVERITY_ORDER[esc.same_gpu_min_severity]
        ):
            history.record_fault(incident)
            n = history.fault_count(incident.root_cause, esc.same_gpu_window_s)
            if n >= esc.same_gpu_count and _rank(esc.same_gpu_action) > _rank(action):
                action, escalated = esc.same_gpu_action, True
                why = (
                    f"{incident.root_cause}: {n} serious GPU incidents within {esc.same_gpu_window_s:g}s "
                    f"(limit {esc.same_gpu_count}) -> {action} (hardware inspection)"
                )
        if history is not None and node and action != ALERT_ONLY:
            loops = history.repair_loops(node)
            if loops >= esc.max_repair_loops and _rank(esc.repair_loop_action) > _rank(action):
                action, escalated = esc.repair_loop_action, True
                why = f"{node} failed again after {loops} repair loops (max {esc.max_repair_loops}) -> {action}"
        if action in AGENT_COMMANDS and action not in self.agent_commands:
            why += f"; {action} not in agent_commands -> evict only"
            action = EVICT
        checkpoint = action in EVICTING_ACTIONS and rule.checkpoint.wanted(incident)
        return Decision(action, checkpoint, why, escalated, node)


# -- loading -----------------------------------------------------------------------------


def default_policy_path() -> Path:
    return Path(str(resources.files("controller.heal").joinpath(DEFAULT_POLICY_FILE)))


def load_policy(path: str | Path | None = None) -> Policy:
    """Load and validate a policy file (None: the packaged default); PolicyError lists every problem."""
    where = default_policy_path() if path is None else Path(path)
    try:
        text = where.read_text(encoding="utf-8")
    except OSError as err:
        raise PolicyError([f"{where}: cannot read policy file: {err.strerror or err}"]) from None
    policy = parse_policy(text, str(where))
    log.info("heal_policy_loaded", source=str(where), kinds=sorted(policy.kinds))
    return policy


def parse_policy(text: str, source: str = "<policy>") -> Policy:
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise PolicyError([f"{source}: not valid YAML{where}: {getattr(err, 'problem', None) or err}"]) from None
    return policy_from_dict(doc, source)


def policy_from_dict(doc: Any, source: str = "<policy>") -> Policy:
    """Validate an already-parsed policy document: every problem at once (``policy_file``'s schema)."""
    if not isinstance(doc, dict):
        raise PolicyError([f"{source}: expected a mapping with 'version' and 'kinds', got {type(doc).__name__}"])
    reading = Reading(SCHEMA, source, doc)
    f = reading.read()
    if f is None:
        raise PolicyError(reading.errors)
    esc, same = f.escalation, f.escalation.same_gpu_fatal_xid
    escalation = Escalation(
        same.count, same.window, same.min_severity, same.action, esc.max_repair_loops, esc.repair_loop_action
    )
    kinds = {name: _kind_policy(k) for name, k in f.kinds.items()}
    return Policy(kinds, frozenset(f.agent_commands), escalation, source, repair_policy(f.repair))


def _kind_policy(k: KindKeys) -> KindPolicy:
    cp = k.checkpoint_first
    if isinstance(cp, bool):
        checkpoint = Checkpoint(always=cp)
    else:
        checkpoint = Checkpoint(False, _match(cp.when), _match(cp.unless))
    by_xid = {UNKNOWN_XID if x == "unknown" else int(x): a for x, a in k.by_xid.items()}
    return KindPolicy(k.action, k.min_severity, checkpoint, dict(k.by_action), by_xid)


def _match(m: MatchKeys | None) -> Match | None:
    if m is None:
        return None
    return Match(frozenset(m.actions), frozenset(m.rules), frozenset(m.severities), frozenset(m.xids))
