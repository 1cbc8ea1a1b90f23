"""Guards between a policy decision and an action on the fleet.

Why: automation that evicts on every fault will, on the day a shared cause (a bad
driver push, a power event, a detector bug) hits half the fleet, evict half the fleet.
Every automatic action passes these checks first, in this order (the first that fails
answers):

1. ``alert_only`` passes (nothing is touched).
2. Never an action on a node for an incident the correlator does not call evictable
   (switch, link, partition, node_down) - whatever the policy said.
3. Circuit breaker: opens by itself on a mass fault (``breaker_trip_share`` of the fleet's
   nodes, at least ``breaker_min_nodes`` or half a small fleet: ``breaker_threshold``; or
   ``breaker_trip_incidents`` evictable incidents, within ``breaker_window_s``) and STAYS open
   until a named person resets it. While open, nothing is acted on.
4. A node someone else drained (``drained_by`` not starpulse) is left to them.
5. Flap protection: a node that came back to healthy more than ``flap_max`` times within
   ``flap_window_s`` is held for a person, not evicted again.
6. Cool-down: no new automatic action on a node within ``cooldown_s`` of the last one,
   unless the node was repaired and returned since (its clock starts afresh at the return).
7. Eviction budget: at most ``max_evictions_per_window`` distinct nodes evicted per
   ``window_s`` (or ``max_evictions_share`` of the fleet, rounded up, when that is more);
   and at most ``max_fleet_share`` of the fleet out of service at once
   (returned and retired nodes free theirs).
8. Mode: ``enforce`` allows; ``dry_run`` (shadow) answers not-allowed with mode
   ``dry_run`` so the orchestrator logs what it WOULD do; ``manual`` files an approval
   request and allows only once a person approved it (the other guards still apply).

A verdict that allows is recorded as a grant (node, incident, mode), so asking again for
the same incident on the same node is idempotent (it does not spend budget twice nor
trip its own cool-down) and a restarted controller keeps its budget. Dry-run grants are
kept apart from real ones, so shadow mode simulates the budget it would have spent.

Returning a node to service is guarded separately (``check_resume``): never for a node
someone else drained, unless a person asks with ``force``.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import structlog

from controller.detect.model import Incident
from controller.heal.policy import ALERT_ONLY, Decision, target_node
from controller.heal.states import (
    AUTOMATIC,
    OUT_OF_SERVICE,
    NodeHealState,
    NodeRecord,
    RemediationStore,
    is_human,
)
from controller.store import transaction
from starpulse.core import vocab
from starpulse.core.clock import Clock
from starpulse.core.schema import setting
from starpulse.core.units import format_duration

log = structlog.get_logger(__name__)

Mode = Literal["enforce", "dry_run", "manual"]
MODES: tuple[str, ...] = ("enforce", "dry_run", "manual")


@dataclass(frozen=True)
class GuardConfig:
    """Limits on automatic remediation. Times in seconds, shares as fractions of the fleet (0..1)."""

    max_evictions_per_window: int = setting(
        2,
        "Distinct nodes that may be evicted (evict, reset_gpu, reboot, rma) per window_s; a node back in "
        "service or the pool gives its place back. 2: a 16,000-GPU fleet (2,000 nodes) sees a few GPU faults "
        "a day, so 2 in 10 minutes is already unusual; the demo, faulting every half minute, sets 4. Kept by "
        "measurement (bench/README.md, issue 28): on the Llama 3 mix at 2,048 nodes it refused no eviction "
        "in 30 days (1 per window refused 5); at three times that rate it refused 9 and 3 none",
        ge=0,
    )
    max_evictions_share: float = setting(
        0.0004,
        "Share of the fleet's nodes (0..1) that may be evicted per window_s, rounded up, when that is more "
        "than max_evictions_per_window (the floor): a budget that grows with the fleet, as its faults do; "
        "0: the absolute count alone. Set by measurement (bench/README.md, issue 28 leftovers): on the "
        "Llama 3 mix at 10,000 nodes a budget of 2 refused 16 and 11 evictions in 30 days (two seeds), 4 "
        "refused 1 and 0; 0.04 % gives 4 there and the floor, 2, up to 5,000 nodes (2,048 refused none at 2)",
        ge=0,
        le=1,
    )
    window_s: float = setting(
        600.0, "Seconds: the sliding window of the eviction budget (10 minutes: a burst, not a day's faults)", gt=0
    )
    max_fleet_share: float = setting(
        0.05,
        "Share of the fleet's nodes (0..1) automation may hold out of service at once: cordoned, draining, "
        "evicted, repairing or validating by starpulse (a node back in service or the pool frees its share, "
        "a retired one has left); at least one node is always allowed. 0.05: 100 nodes of 2,000, more than "
        "a normal day's repairs, far less than a bad driver push; 17 nodes round down to 1, so the demo, "
        "whose faults overlap, allows 2",
        gt=0,
        le=1,
    )
    breaker_trip_share: float = setting(
        0.05,
        "Share of the fleet (0..1): the breaker opens when nodes with evictable incidents opened within "
        "breaker_window_s reach it (and at least breaker_min_nodes). Set by measurement (bench/README.md, "
        "issue 28, python -m bench.fleetsim_defaults): on the Llama 3 mix the most nodes faulting within "
        "5 minutes was 3 at 2,048 nodes and 5 at 10,000 nodes, at three times its rate; 5 % "
        "(103 of 2,048) is far above that and trips on a mass event (10 % of the nodes at once). 0.5 "
        "before: a 10 % event never tripped it",
        gt=0,
        le=1,
    )
    breaker_window_s: float = setting(300.0, "Seconds back that incidents count towards tripping the breaker", gt=0)
    breaker_trip_incidents: int = setting(
        0, "The breaker also opens at this many evictable incidents within the window; 0: off", ge=0
    )
    breaker_min_nodes: int = setting(
        8,
        "Never trip on fewer faulty nodes than this, unless that is more than half the fleet (then half, at "
        "least 2: a 12-node lab trips at 6, a 2-node lab is not a mass fault at 1). 8: above the 5 nodes in "
        "5 minutes measured at 10,000 nodes and three times the Llama 3 rate, so a mid-size fleet's breaker "
        "does not trip on independent faults",
        ge=1,
    )
    mode: Mode = setting(
        "enforce", "enforce: act; dry_run: decide and log, never act; manual: act only on a person's approval"
    )
    cooldown_s: float = setting(
        1800.0,
        "Seconds: no new automatic action on a node this long after its last, while that action's node is "
        "still out; a node repaired, validated and back starts afresh at its return (the lemon score, not "
        "the cool-down, retires repeat offenders). 30 minutes: longer than a reboot and validation, so "
        "one fault is never acted on twice, at any fleet size",
        ge=0,
    )
    flap_window_s: float = setting(3600.0, "Seconds: the window of flap protection", gt=0)
    flap_max: int = setting(
        3,
        "A node that returned to healthy more than this many times within flap_window_s is held (a spare "
        "put to work is not a return)",
        ge=1,
    )

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"guard mode {self.mode!r}: expected one of {', '.join(MODES)}")
        for name in ("window_s", "breaker_window_s", "cooldown_s", "flap_window_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        for name in ("max_fleet_share", "breaker_trip_share"):
            if not 0 < getattr(self, name) <= 1:
                raise ValueError(f"{name} must be a share in (0, 1], got {getattr(self, name)}")
        if not 0 <= self.max_evictions_share <= 1:
            raise ValueError(f"max_evictions_share must be a share in [0, 1], got {self.max_evictions_share}")
        for name in ("max_evictions_per_window", "breaker_trip_incidents", "breaker_min_nodes", "flap_max"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Verdict:
    """Whether the orchestrator may act now, and why (``code`` is stable, for metrics and tests)."""

    allowed: bool
    reason: str
    mode: str
    code: str = "ok"


@dataclass(frozen=True)
class BreakerState:
    open: bool
    opened_ms: int | None
    reason: str
    closed_by: str | None
    closed_ms: int | None


@dataclass(frozen=True)
class Approval:
    incident_id: str
    node: str
    action: str
    status: str  # pending | approved | rejected
    requested_ms: int
    decided_by: str | None
    decided_ms: int | None
    reason: str


_SCHEMA = """
CREATE TABLE IF NOT EXISTS heal_breaker (
    id INTEGER PRIMARY KEY CHECK (id = 1),
    state TEXT NOT NULL,
    opened_ms INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    closed_by TEXT,
    closed_ms INTEGER
);
CREATE TABLE IF NOT EXISTS heal_breaker_log (
    at_ms INTEGER NOT NULL,
    event TEXT NOT NULL,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS heal_grants (
    node TEXT NOT NULL,
    incident_id TEXT NOT NULL,
    action TEXT NOT NULL,
    mode TEXT NOT NULL,
    at_ms INTEGER NOT NULL,
    PRIMARY KEY (node, incident_id, mode)
);
CREATE INDEX IF NOT EXISTS heal_grants_at ON heal_grants(mode, at_ms);
CREATE TABLE IF NOT EXISTS heal_approvals (
    incident_id TEXT NOT NULL,
    node TEXT NOT NULL,
    action TEXT NOT NULL,
    status TEXT NOT NULL,
    requested_ms INTEGER NOT NULL,
    decided_by TEXT,
    decided_ms INTEGER,
    reason TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (incident_id, node)
);
"""


class CircuitBreaker:
    """Fleet-wide stop switch, persisted: once open, only a named person closes it."""

    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        self._db = conn
        self.clock = clock
        self._clock = clock.time_ms
        self._db.executescript(_SCHEMA)

    def state(self) -> BreakerState:
        row = self._db.execute(
            "SELECT state, opened_ms, reason, closed_by, closed_ms FROM heal_breaker WHERE id = 1"
        ).fetchone()
        if row is None:
            return BreakerState(False, None, "", None, None)
        return BreakerState(row[0] == "open", row[1], row[2], row[3], row[4])

    @property
    def is_open(self) -> bool:
        return self.state().open

    def trip(self, reason: str, actor: str = AUTOMATIC) -> bool:
        """Open the breaker; True when it was closed. An open breaker keeps its first reason."""
        now = self._clock()
        with transaction(self._db):
            if self.state().open:
                return False
            self._db.execute(
                "INSERT INTO heal_breaker(id, state, opened_ms, reason, closed_by, closed_ms) "
                "VALUES (1, 'open', ?, ?, NULL, NULL) ON CONFLICT(id) DO UPDATE SET state = 'open', "
                "opened_ms = excluded.opened_ms, reason = excluded.reason, closed_by = NULL, closed_ms = NULL",
                (now, reason),
            )
            self._db.execute(
                "INSERT INTO heal_breaker_log(at_ms, event, actor, reason) VALUES (?, 'open', ?, ?)",
                (now, actor, reason),
            )
        log.warning("heal_breaker_opened", reason=reason, actor=actor)
        return True

    def reset(self, actor: str, reason: str = "") -> bool:
        """Close the breaker; only a named person may. True when it was open."""
        if not is_human(actor):
            raise PermissionError(f"the circuit breaker is closed by a named person, not {actor!r}")
        now = self._clock()
        with transaction(self._db):
            if not self.state().open:
                return False
            self._db.execute(
                "UPDATE heal_breaker SET state = 'closed', closed_by = ?, closed_ms = ? WHERE id = 1", (actor, now)
            )
            self._db.execute(
                "INSERT INTO heal_breaker_log(at_ms, event, actor, reason) VALUES (?, 'close', ?, ?)",
                (now, actor, reason),
            )
        log.warning("heal_breaker_closed", actor=actor, reason=reason)
        return True

    def log(self) -> list[tuple[int, str, str, str]]:
        """(at_ms, open|close, actor, reason), oldest first."""
        return [
            tuple(r)
            for r in self._db.execute("SELECT at_ms, event, actor, reason FROM heal_breaker_log ORDER BY rowid")
        ]


def breaker_threshold(cfg: GuardConfig, fleet_size: int) -> int:
    """Faulty nodes within the window that open the breaker: ``breaker_trip_share`` of the fleet,
    never fewer than ``breaker_min_nodes`` unless that is more than half the fleet (then half, at
    least 2). Up to 16 nodes this is half the fleet (as the 0.5 share before it gave); from 160
    nodes on, the share."""
    floor = min(cfg.breaker_min_nodes, max(2, math.ceil(fleet_size / 2)))
    return max(floor, math.ceil(cfg.breaker_trip_share * fleet_size))


def eviction_budget(cfg: GuardConfig, fleet_size: int) -> int:
    """Distinct nodes that may be evicted per window: the share of the fleet, at least the floor."""
    return max(cfg.max_evictions_per_window, math.ceil(cfg.max_evictions_share * fleet_size))


def fleet_share_refusal(node: str, out: set[str], fleet_size: int, max_share: float) -> str | None:
    """Why taking ``node`` out would exceed the fleet share (``out``: nodes already out), or None.

    The one rule for every drain, the healer's and a Slurm prolog's alike: at most
    ``max_share`` of the fleet out of service at once, at least one node always allowed.
    """
    limit = max(1, math.floor(max_share * fleet_size))
    if node not in out and len(out) + 1 > limit:
        return f"fleet share: {len(out)} of {fleet_size} nodes already out (max {max_share:g} = {limit})"
    return None


def _blamed(inc: Incident) -> list[str]:
    """The nodes an evictable incident counts against the breaker: the one it blames, else those it
    touches; a hang only the nodes its evidence names (its other nodes merely wait on them)."""
    if inc.kind == "job_hang":
        return sorted({str(n) for e in inc.evidence for n in (e.get("evidence") or {}).get("suspect_nodes") or []})
    n = target_node(inc)
    return [n] if n else list(inc.affected_nodes)


class Guards:
    """The checks of the module docstring, over the remediation store and their own tables."""

    def __init__(
        self,
        config: GuardConfig,
        store: RemediationStore,
        conn: sqlite3.Connection | None,
        clock: Clock,
    ) -> None:
        self.config = config
        self.store = store
        self._db = conn if conn is not None else store.conn
        self.clock = clock
        self._clock = self.clock.time_ms
        self.breaker = CircuitBreaker(self._db, self.clock)

    # -- the check ---------------------------------------------------------------------------

    def check(
        self,
        node: str | None,
        decision: Decision,
        incident: Incident,
        fleet_size: int,
        active_evictable_incidents: Sequence[Incident] = (),
    ) -> Verdict:
        """May the orchestrator carry out ``decision`` on ``node`` now? Records a grant when so."""
        verdict = self._check(node, decision, incident, fleet_size, active_evictable_incidents)
        log.info(
            "heal_guard_verdict",
            node=node,
            incident=incident.id,
            action=decision.action,
            allowed=verdict.allowed,
            code=verdict.code,
            mode=verdict.mode,
            reason=verdict.reason,
        )
        return verdict

    def _check(
        self,
        node: str | None,
        decision: Decision,
        incident: Incident,
        fleet_size: int,
        active: Sequence[Incident],
    ) -> Verdict:
        mode = self.config.mode
        if decision.action == ALERT_ONLY:
            return Verdict(True, "alert only: nothing on the fleet is touched", mode, "alert_only")
        if not vocab.may_evict(incident.kind):
            return Verdict(
                False, f"{incident.kind} is not evictable: never act on a node for it", mode, "not_evictable"
            )
        if not node:
            return Verdict(False, f"{incident.id} names no single node to act on", mode, "no_node")
        self.observe([*active, incident], fleet_size)
        breaker = self.breaker.state()
        if breaker.open:
            return Verdict(
                False,
                f"circuit breaker open for {format_duration((self._clock() - (breaker.opened_ms or 0)) / 1000)}: "
                f"{breaker.reason}",
                mode,
                "breaker_open",
            )
        record = self.store.record(node)
        if record.drained_by not in (None, AUTOMATIC):
            return Verdict(
                False, f"{node} was drained by {record.drained_by}; leaving it to them", mode, "foreign_drain"
            )
        now = self._clock()
        granted_mode = "dry_run" if mode == "dry_run" else "real"
        already = self._db.execute(
            "SELECT 1 FROM heal_grants WHERE node = ? AND incident_id = ? AND mode = ?",
            (node, incident.id, granted_mode),
        ).fetchone()
        if already is None:
            denied = self._limits(node, decision, fleet_size, granted_mode, now)
            if denied is not None:
                return denied
        if mode == "dry_run":
            self._grant(node, incident, decision, granted_mode, now)
            return Verdict(False, f"dry run: would {decision.action} {node} for {incident.id}", mode, "dry_run")
        if mode == "manual":
            approval = self.request_approval(incident, node, decision)
            if approval.status == "rejected":
                return Verdict(False, f"rejected by {approval.decided_by}", mode, "rejected")
            if approval.status != "approved":
                return Verdict(
                    False,
                    f"waiting for a person to approve {decision.action} {node} ({incident.id})",
                    mode,
                    "approval_required",
                )
        self._grant(node, incident, decision, granted_mode, now)
        why = "within limits"
        if mode == "manual":
            decided = self.approval(incident.id, node)
            why = f"approved by {decided.decided_by if decided else '?'}"
        return Verdict(True, f"{decision.action} {node}: {why}", mode, "ok")

    def _limits(self, node: str, decision: Decision, fleet_size: int, granted_mode: str, now: int) -> Verdict | None:
        cfg, mode = self.config, self.config.mode
        flap_since = now - int(cfg.flap_window_s * 1000)
        flaps = sum(
            1
            for t in self.store.history(node, since_ms=flap_since)
            # A spare put to work is not a flap: it was healthy all along.
            if t.to_state == NodeHealState.IN_SERVICE and t.from_state not in _NOT_A_FLAP
        )
        if flaps > cfg.flap_max:
            return Verdict(
                False,
                f"{node} flapped {flaps} times in {format_duration(cfg.flap_window_s)} "
                f"(max {cfg.flap_max}): held for a person",
                mode,
                "flapping",
            )
        last = self._db.execute(
            "SELECT MAX(at_ms) FROM heal_grants WHERE node = ? AND mode = ?", (node, granted_mode)
        ).fetchone()[0]
        record = self.store.record(node)
        # The cool-down counts from the last action only while that action's node is still
        # out: repaired, validated and back (spare or service) since, its clock starts afresh
        # at the return, and a node that keeps failing is the lemon score's to retire.
        if last is not None and not _returned_since(record, last) and now - last < cfg.cooldown_s * 1000:
            return Verdict(
                False,
                f"{node} cooling down: last action {format_duration((now - last) / 1000)} ago "
                f"(cooldown {format_duration(cfg.cooldown_s)})",
                mode,
                "cooldown",
            )
        since = now - int(cfg.window_s * 1000)
        records = {r.node: r for r in self.store.all_records()}
        if decision.evicts:
            # A node repaired and back since its eviction gives its place in the budget back:
            # the budget bounds nodes taken out, not faults handled.
            evicted = {
                n
                for n, at in self._db.execute(
                    "SELECT node, MAX(at_ms) FROM heal_grants WHERE mode = ? AND at_ms > ? AND action IN "
                    "('evict', 'reset_gpu', 'reboot', 'rma') GROUP BY node",
                    (granted_mode, since),
                )
                if not _returned_since(records.get(n), at)
            } - {node}
            budget = eviction_budget(cfg, fleet_size)
            if len(evicted) >= budget:
                return Verdict(
                    False,
                    f"eviction budget spent: {len(evicted)} nodes in {format_duration(cfg.window_s)} (max {budget})",
                    mode,
                    "budget",
                )
        out = {n for n, r in records.items() if r.state in OUT_OF_SERVICE and r.drained_by == AUTOMATIC}
        granted = dict(
            self._db.execute(
                "SELECT node, MAX(at_ms) FROM heal_grants WHERE mode = ? AND at_ms > ? GROUP BY node",
                (granted_mode, since),
            ).fetchall()
        )
        # Nodes in repair count (they are out), and so do nodes granted but not yet moved (an
        # action in flight); a node repaired and back (spare or in service since its grant)
        # frees its share, or a 16-node demo wedges after one fault, and so does a retired
        # one: it has left the fleet for RMA, it is not automation's capacity held out.
        out |= {n for n, at in granted.items() if _in_flight(records.get(n), at)}
        refusal = fleet_share_refusal(node, out, fleet_size, cfg.max_fleet_share)
        if refusal is not None:
            return Verdict(False, refusal, mode, "fleet_share")
        return None

    def _grant(self, node: str, incident: Incident, decision: Decision, granted_mode: str, now: int) -> None:
        with transaction(self._db):
            self._db.execute(
                "INSERT OR IGNORE INTO heal_grants(node, incident_id, action, mode, at_ms) VALUES (?, ?, ?, ?, ?)",
                (node, incident.id, decision.action, granted_mode, now),
            )

    def observe(self, incidents: Sequence[Incident], fleet_size: int) -> bool:
        """Trip the breaker on a mass fault; call it every tick, not only on decisions. True when it opened."""
        cfg = self.config
        since = self._clock() - int(cfg.breaker_window_s * 1000)
        # Informational incidents (an application's Xid 43 on every node after a bad job) are
        # alerts, never evictions: a fleet-wide burst of them is not a mass fault.
        recent = {
            i.id: i
            for i in incidents
            if vocab.may_evict(i.kind) and i.active and i.opened_ms >= since and i.severity != "info"
        }
        nodes: set[str] = set()
        for inc in recent.values():
            nodes.update(_blamed(inc))
        need = breaker_threshold(cfg, fleet_size)
        reason = ""
        if fleet_size > 0 and len(nodes) >= need:
            reason = (
                f"{len(nodes)} of {fleet_size} nodes faulty within {format_duration(cfg.breaker_window_s)} "
                f"(trip at {cfg.breaker_trip_share:g} = {need})"
            )
        elif cfg.breaker_trip_incidents and len(recent) >= cfg.breaker_trip_incidents:
            reason = (
                f"{len(recent)} evictable incidents within {format_duration(cfg.breaker_window_s)} "
                f"(trip at {cfg.breaker_trip_incidents})"
            )
        return bool(reason) and self.breaker.trip(reason)

    # -- returning to service ----------------------------------------------------------------

    def check_resume(self, node: str, actor: str = AUTOMATIC, force: bool = False) -> Verdict:
        """May ``actor`` put ``node`` back into service? Never someone else's drain, unless a person forces it."""
        mode = self.config.mode
        owner = self.store.drained_by(node)
        if owner in (None, AUTOMATIC) or owner == actor:
            return Verdict(True, f"{node} was taken out by {owner or 'nobody'}", mode, "ok")
        if is_human(actor) and force:
            log.warning("heal_forced_resume", node=node, actor=actor, drained_by=owner)
            return Verdict(True, f"{actor} forces {node} back over a drain by {owner}", mode, "forced")
        return Verdict(
            False, f"{node} was drained by {owner}; only a person with force may return it", mode, "foreign_drain"
        )

    # -- approvals ---------------------------------------------------------------------------

    def request_approval(self, incident: Incident, node: str, decision: Decision) -> Approval:
        """File (once) a request for a person to approve ``decision`` on ``node``; returns its current row."""
        with transaction(self._db):
            cur = self._db.execute(
                "INSERT OR IGNORE INTO heal_approvals(incident_id, node, action, status, requested_ms, reason) "
                "VALUES (?, ?, ?, 'pending', ?, ?)",
                (incident.id, node, decision.action, self._clock(), decision.reason),
            )
        if cur.rowcount:
            log.info("heal_approval_requested", incident=incident.id, node=node, action=decision.action)
        approval = self.approval(incident.id, node)
        assert approval is not None
        return approval

    def approve(self, incident_id: str, actor: str, node: str | None = None) -> list[Approval]:
        """A person approves the pending request(s) of an incident (one node, or all of them)."""
        return self._decide(incident_id, actor, node, "approved")

    def reject(self, incident_id: str, actor: str, node: str | None = None) -> list[Approval]:
        return self._decide(incident_id, actor, node, "rejected")

    def _decide(self, incident_id: str, actor: str, node: str | None, status: str) -> list[Approval]:
        if not is_human(actor):
            raise PermissionError(f"approvals are decided by a named person, not {actor!r}")
        q = "WHERE incident_id = ? AND status = 'pending'" + (" AND node = ?" if node else "")
        args: tuple[str, ...] = (incident_id, node) if node else (incident_id,)
        with transaction(self._db):
            nodes = [r[0] for r in self._db.execute(f"SELECT node FROM heal_approvals {q}", args)]
            self._db.execute(
                f"UPDATE heal_approvals SET status = ?, decided_by = ?, decided_ms = ? {q}",
                (status, actor, self._clock(), *args),
            )
        if not nodes:
            raise KeyError(f"no pending approval for {incident_id}" + (f" on {node}" if node else ""))
        log.info("heal_approval_decided", incident=incident_id, nodes=nodes, status=status, actor=actor)
        return [a for a in (self.approval(incident_id, n) for n in nodes) if a is not None]

    def approval(self, incident_id: str, node: str) -> Approval | None:
        row = self._db.execute(
            "SELECT incident_id, node, action, status, requested_ms, decided_by, decided_ms, reason "
            "FROM heal_approvals WHERE incident_id = ? AND node = ?",
            (incident_id, node),
        ).fetchone()
        return Approval(*row) if row else None

    def pending_approvals(self) -> list[Approval]:
        """Requests waiting for a person, oldest first."""
        rows = self._db.execute(
            "SELECT incident_id, node, action, status, requested_ms, decided_by, decided_ms, reason "
            "FROM heal_approvals WHERE status = 'pending' ORDER BY requested_ms, incident_id, node"
        )
        return [Approval(*r) for r in rows]


RETURNED = frozenset({NodeHealState.SPARE, NodeHealState.IN_SERVICE})


def _returned_since(record: NodeRecord | None, at_ms: int) -> bool:
    """The node went back to work (spare pool or service) after the grant at ``at_ms``."""
    return record is not None and record.state in RETURNED and record.since_ms > at_ms


_NOT_A_FLAP = frozenset({NodeHealState.IN_SERVICE, NodeHealState.SPARE})


def _in_flight(record: NodeRecord | None, at_ms: int) -> bool:
    """A node granted an action at ``at_ms`` that still holds its share of the fleet: out of
    service now, or not yet moved (granted, the action under way); not back, not retired."""
    if record is None:
        return True
    if record.state in OUT_OF_SERVICE:
        return True
    if record.state == NodeHealState.RETIRED or _returned_since(record, at_ms):
        return False
    return record.since_ms <= at_ms or record.state == NodeHealState.SUSPECT
