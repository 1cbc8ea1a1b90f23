"""Per-node remediation state, persisted on the controller's SQLite connection.

Why persisted: a controller that restarts half-way through draining a node must know
that the node is draining, who drained it and which incident it was for, or it will
either forget the node (stuck cordoned forever) or act twice (evict the same job twice).

Lifecycle (see ``ALLOWED``): one enum that ``starpulse nodes``, ``/api``, ``/metrics`` and
the dashboard all show, each state with since-when and why::

    in_service -> suspect -> cordoned -> draining -> evicted -> repairing -> validating -> spare
                                                                  ^   \\         |  \\-> in_service
                                                                  \\----+--------/ (failed: next rung)
                                                                       \\-> retired (RMA)

``spare`` is a node that passed validation after a repair and waits in the spare pool; it
takes work (``in_service``) when the healer hands it to a job or a person resumes it.
Keeping it apart from ``in_service`` lets the history show "came back from repair" apart
from "never left". A node with no row is ``in_service``.

A store written before these names (``healthy``, ``in_repair``, ``returned``) is migrated
once, in one transaction, when the store opens (``migrate_lifecycle``).

``drained_by`` remembers who took the node out of service: ``starpulse`` (this controller,
``AUTOMATIC``), a named human, or ``external`` when the scheduler showed a drain nobody
here made. Guards refuse to put a node back into service that someone else drained.

``pending_actions`` is the orchestrator's write-ahead log: plan an action (a row with
status ``planned``), perform it, then mark it ``done`` or ``failed``. A restarted
controller replays ``planned()``; so an action may be performed twice when the controller
dies between acting and marking, which is why every scheduler action must be idempotent
(draining a drained node, requeueing a pending job, cordoning a cordoned node: no-ops).

The connection is expected in autocommit mode (``isolation_level=None``), as the
controller's store opens it; every write here is one explicit transaction.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass
from enum import StrEnum

import structlog

from controller.store import transaction
from starpulse.core.clock import Clock

log = structlog.get_logger(__name__)

AUTOMATIC = "starpulse"
"""The actor name of this controller's automatic actions."""
EXTERNAL = "external"
"""The actor of a drain seen in the scheduler that nobody here made."""


def is_human(actor: str | None) -> bool:
    """A named person: anything but the controller itself, ``external`` or empty."""
    return bool(actor and actor.strip()) and actor not in (AUTOMATIC, EXTERNAL)


class NodeHealState(StrEnum):
    """Where a node is in remediation. Values are the strings stored in SQLite."""

    IN_SERVICE = "in_service"
    SUSPECT = "suspect"
    CORDONED = "cordoned"
    DRAINING = "draining"
    EVICTED = "evicted"
    REPAIRING = "repairing"
    VALIDATING = "validating"
    SPARE = "spare"
    RETIRED = "retired"


S = NodeHealState

ALLOWED: dict[NodeHealState, frozenset[NodeHealState]] = {
    S.IN_SERVICE: frozenset({S.SUSPECT, S.CORDONED, S.DRAINING}),
    S.SUSPECT: frozenset({S.IN_SERVICE, S.CORDONED, S.DRAINING}),
    # A cordon can be lifted (false alarm) or go straight to repair when the node is idle.
    S.CORDONED: frozenset({S.IN_SERVICE, S.DRAINING, S.EVICTED, S.REPAIRING, S.RETIRED}),
    S.DRAINING: frozenset({S.CORDONED, S.EVICTED, S.IN_SERVICE}),
    # Straight to validating when the fault needs no repair action (its evidence may just clear).
    S.EVICTED: frozenset({S.REPAIRING, S.VALIDATING, S.RETIRED}),
    S.REPAIRING: frozenset({S.VALIDATING, S.RETIRED}),
    # Failed validation goes back to repairing (the next rung) or to retired (the ladder's end).
    S.VALIDATING: frozenset({S.SPARE, S.IN_SERVICE, S.REPAIRING, S.RETIRED}),
    S.SPARE: frozenset({S.IN_SERVICE, S.SUSPECT, S.CORDONED, S.DRAINING, S.REPAIRING, S.RETIRED}),
    # Back from RMA: a human sends it through repair validation again.
    S.RETIRED: frozenset({S.REPAIRING}),
}
"""Explicit allowed transitions; anything else raises ``InvalidTransition``. A transition to
the current state is always allowed (it re-attaches the node to a new incident)."""

OUT_OF_SERVICE: frozenset[NodeHealState] = frozenset({S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING})
"""States in which the node takes no new work because someone took it out."""

_TAKEN_OUT = frozenset({S.CORDONED, S.DRAINING})
_IN_SERVICE = frozenset({S.IN_SERVICE, S.SUSPECT, S.SPARE})
_RETURNING = frozenset({S.IN_SERVICE, S.SPARE})  # back to work: only a drain starpulse owns is undone

LEGACY_STATES: dict[str, NodeHealState] = {
    "healthy": S.IN_SERVICE,
    "in_repair": S.REPAIRING,
    # ``returned`` meant "repaired and validated, has not taken work yet": a spare now.
    "returned": S.SPARE,
}
"""The states a store written before the lifecycle names holds, and what each becomes."""

ACTION_KINDS: tuple[str, ...] = (
    "cordon",
    "drain",
    "evict",
    "resume",
    "reboot",
    "reset_gpu",
    "requeue",
    "checkpoint",
    "restart_in_place",  # a hung job restarted where it runs (node: "job:<name>")
)
ACTION_STATUSES: tuple[str, ...] = ("planned", "done", "failed")


class ForeignDrain(ValueError):
    """An automatic attempt to put back into service a node someone else took out."""


class InvalidTransition(ValueError):
    """A state change the lifecycle does not allow (names from and to)."""

    def __init__(self, node: str, from_state: str, to_state: str) -> None:
        from_state, to_state = str(from_state), str(to_state)  # plain strings in the message, not enum reprs
        self.node, self.from_state, self.to_state = node, from_state, to_state
        allowed = ", ".join(sorted(ALLOWED.get(NodeHealState(from_state), ()))) or "nothing"
        super().__init__(
            f"{node}: cannot go from {from_state!r} to {to_state!r} (from {from_state!r} allowed: {allowed})"
        )


@dataclass(frozen=True)
class Transition:
    """One recorded state change: who did it, why, for which incident."""

    id: int
    node: str
    from_state: NodeHealState
    to_state: NodeHealState
    reason: str
    incident_id: str | None
    actor: str
    at_ms: int


@dataclass(frozen=True)
class NodeRecord:
    """A node's current remediation row; a node never seen is healthy with no row."""

    node: str
    state: NodeHealState
    since_ms: int
    incident_id: str | None
    drained_by: str | None
    repair_loops: int
    updated_ms: int
    reason: str = ""  # why it is in this state (the last transition's reason)


@dataclass(frozen=True)
class PendingAction:
    """One step of a remediation, logged before it is performed (see module docstring)."""

    action_id: str
    node: str
    kind: str
    incident_id: str | None
    job: str | None
    status: str
    attempts: int
    last_error: str | None
    created_ms: int
    updated_ms: int


_SCHEMA = """
CREATE TABLE IF NOT EXISTS heal_nodes (
    node TEXT PRIMARY KEY,
    state TEXT NOT NULL,
    since_ms INTEGER NOT NULL,
    incident_id TEXT,
    drained_by TEXT,
    repair_loops INTEGER NOT NULL DEFAULT 0,
    updated_ms INTEGER NOT NULL,
    reason TEXT NOT NULL DEFAULT ''
);
CREATE INDEX IF NOT EXISTS heal_nodes_state ON heal_nodes(state);
CREATE TABLE IF NOT EXISTS heal_transitions (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    node TEXT NOT NULL,
    from_state TEXT NOT NULL,
    to_state TEXT NOT NULL,
    reason TEXT NOT NULL,
    incident_id TEXT,
    actor TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS heal_transitions_node ON heal_transitions(node, at_ms);
CREATE TABLE IF NOT EXISTS heal_pending_actions (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    action_id TEXT UNIQUE,
    node TEXT NOT NULL,
    kind TEXT NOT NULL,
    incident_id TEXT,
    job TEXT,
    status TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS heal_pending_actions_status ON heal_pending_actions(status, seq);
"""


def lifecycle_records(conn: sqlite3.Connection) -> dict[str, NodeRecord]:
    """Every node's lifecycle row by name, read-only: for the query API, /api and the metrics.

    A controller without self-healing (or a standby whose mirror has not brought the table
    yet) has no rows, and every node is then ``in_service``: what is shown is never made up.
    """
    try:
        rows = conn.execute(
            "SELECT node, state, since_ms, incident_id, drained_by, repair_loops, updated_ms, reason FROM heal_nodes"
        ).fetchall()
    except sqlite3.OperationalError:  # no such table (or no reason column yet: not migrated)
        return {}
    return {r[0]: NodeRecord(r[0], NodeHealState(r[1]), *r[2:]) for r in rows}


def lifecycle_counts(conn: sqlite3.Connection, fleet_size: int) -> dict[NodeHealState, int]:
    """Nodes per lifecycle state (every state present): those without a row are in service."""
    counts = dict.fromkeys(NodeHealState, 0)
    try:
        for state, n in conn.execute("SELECT state, COUNT(*) FROM heal_nodes GROUP BY state"):
            counts[NodeHealState(state)] = int(n)
    except sqlite3.OperationalError:
        pass
    taken = sum(n for st, n in counts.items() if st != S.IN_SERVICE)
    counts[S.IN_SERVICE] = max(0, fleet_size - taken)
    return counts


def parse_states(names: Iterable[str]) -> frozenset[NodeHealState]:
    """Lifecycle state names as a person typed them; ValueError naming the bad one and the choices."""
    out = set()
    for name in names:
        key = name.strip().lower().replace("-", "_")
        try:
            out.add(NodeHealState(key))
        except ValueError:
            choices = ", ".join(s.value for s in NodeHealState)
            raise ValueError(f"unknown lifecycle state {name!r} (expected one of {choices})") from None
    return frozenset(out)


def migrate_lifecycle(conn: sqlite3.Connection) -> int:
    """Bring a store written before the lifecycle names up to them; returns the rows changed.

    One step, in one transaction, safe to run on every start (a migrated store changes
    nothing): add ``heal_nodes.reason`` (filled from each node's last transition), then
    rename ``LEGACY_STATES`` in the node rows and in the transition history, so the history
    reads in the same words as the states. A controller that opened the old file would
    otherwise fail on the first ``NodeHealState("healthy")``.
    """
    changed = 0
    with transaction(conn):
        columns = {r[1] for r in conn.execute("PRAGMA table_info(heal_nodes)")}
        if "reason" not in columns:
            conn.execute("ALTER TABLE heal_nodes ADD COLUMN reason TEXT NOT NULL DEFAULT ''")
            cur = conn.execute(
                "UPDATE heal_nodes SET reason = COALESCE((SELECT t.reason FROM heal_transitions t "
                "WHERE t.node = heal_nodes.node ORDER BY t.id DESC LIMIT 1), '')"
            )
            changed += cur.rowcount
        for old, new in LEGACY_STATES.items():
            changed += conn.execute("UPDATE heal_nodes SET state = ? WHERE state = ?", (new, old)).rowcount
            for column in ("from_state", "to_state"):
                changed += conn.execute(
                    f"UPDATE heal_transitions SET {column} = ? WHERE {column} = ?", (new, old)
                ).rowcount
    if changed:
        log.warning("heal_lifecycle_migrated", rows=changed, renamed={k: str(v) for k, v in LEGACY_STATES.items()})
    return changed


class RemediationStore:
    """Node states, their transition history and the pending-action log, in SQLite."""

    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        self.conn = conn
        self.clock = clock  # guards, heal history and spares default to it
        self.conn.executescript(_SCHEMA)
        migrate_lifecycle(self.conn)

    # -- node state ------------------------------------------------------------------------

    def record(self, node: str) -> NodeRecord:
        """The node's current row; an unknown node is healthy since 0."""
        row = self.conn.execute(
            "SELECT node, state, since_ms, incident_id, drained_by, repair_loops, updated_ms, reason "
            "FROM heal_nodes WHERE node = ?",
            (node,),
        ).fetchone()
        if row is None:
            return NodeRecord(node, S.IN_SERVICE, 0, None, None, 0, 0)
        return NodeRecord(row[0], NodeHealState(row[1]), row[2], row[3], row[4], row[5], row[6], row[7])

    def state(self, node: str) -> NodeHealState:
        return self.record(node).state

    def drained_by(self, node: str) -> str | None:
        """Who took the node out of service (None while it is in service)."""
        return self.record(node).drained_by

    def repair_loops(self, node: str) -> int:
        """How many times the node has entered ``in_repair`` (lifetime, until reset)."""
        return self.record(node).repair_loops

    def nodes_in(self, state: NodeHealState | str) -> list[str]:
        """Nodes currently in ``state``, by name. ``healthy`` lists only nodes with a row."""
        st = NodeHealState(state)
        return [r[0] for r in self.conn.execute("SELECT node FROM heal_nodes WHERE state = ? ORDER BY node", (st,))]

    def all_records(self) -> list[NodeRecord]:
        """Every node with a row, by name (for the CLI and the metrics)."""
        names = [r[0] for r in self.conn.execute("SELECT node FROM heal_nodes ORDER BY node")]
        return [self.record(n) for n in names]

    def transition(
        self,
        node: str,
        to: NodeHealState | str,
        reason: str,
        incident_id: str | None = None,
        actor: str = AUTOMATIC,
    ) -> Transition | None:
        """Move ``node`` to ``to`` and record why; None when it is already there for that incident.

        Raises ``InvalidTransition`` for a change ``ALLOWED`` does not list. Entering
        cordoned/draining from service records ``actor`` as ``drained_by``; going back to
        service (``in_service`` or ``spare``) clears it. Entering ``repairing`` counts one
        repair loop. An automatic (non-human) return of a node someone else drained raises
        ``ForeignDrain``.
        """
        target = NodeHealState(to)
        if not actor:
            raise ValueError("transition needs an actor ('starpulse' or a person's name)")
        now = self.clock.time_ms()
        with transaction(self.conn):
            cur = self.record(node)
            if cur.state == target and cur.incident_id == incident_id:
                return None
            if target != cur.state and target not in ALLOWED[cur.state]:
                raise InvalidTransition(node, cur.state, target)
            returning = target in _RETURNING
            if returning and not is_human(actor) and cur.drained_by not in (None, AUTOMATIC):
                # Last line of defence behind the guards: never undo someone else's drain.
                raise ForeignDrain(f"{node}: drained by {cur.drained_by!r}; only a person may return it to service")
            drained_by = cur.drained_by
            if target in _TAKEN_OUT and (cur.state in _IN_SERVICE or drained_by is None):
                drained_by = actor
            elif returning:
                drained_by = None
            loops = cur.repair_loops + (1 if target == S.REPAIRING and cur.state != S.REPAIRING else 0)
            since = cur.since_ms if target == cur.state else now
            self.conn.execute(
                """INSERT INTO heal_nodes(node, state, since_ms, incident_id, drained_by, repair_loops, updated_ms,
                                          reason)
                   VALUES (?, ?, ?, ?, ?, ?, ?, ?)
                   ON CONFLICT(node) DO UPDATE SET state = excluded.state, since_ms = excluded.since_ms,
                       incident_id = excluded.incident_id, drained_by = excluded.drained_by,
                       repair_loops = excluded.repair_loops, updated_ms = excluded.updated_ms,
                       reason = excluded.reason""",
                (node, target, since, incident_id, drained_by, loops, now, reason),
            )
            c = self.conn.execute(
                "INSERT INTO heal_transitions(node, from_state, to_state, reason, incident_id, actor, at_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (node, cur.state, target, reason, incident_id, actor, now),
            )
            tid = c.lastrowid
            assert tid is not None
        log.info(
            "heal_transition",
            node=node,
            from_state=str(cur.state),
            to_state=str(target),
            reason=reason,
            incident=incident_id,
            actor=actor,
        )
        return Transition(tid, node, cur.state, target, reason, incident_id, actor, now)

    def record_external_drain(
        self, node: str, actor: str = EXTERNAL, reason: str = "drained outside starpulse"
    ) -> Transition | None:
        """The scheduler shows a drain we did not make: remember who owns it.

        A node in service becomes ``cordoned`` with ``drained_by = actor``; a node we had
        already taken out keeps its state but its owner becomes ``actor`` (someone else now
        holds it too, so we must not put it back). Idempotent.
        """
        now = self.clock.time_ms()
        with transaction(self.conn):
            cur = self.record(node)
            if cur.state in _IN_SERVICE:
                return self.transition(node, S.CORDONED, reason, cur.incident_id, actor)
            if cur.drained_by == actor:
                return None
            self.conn.execute("UPDATE heal_nodes SET drained_by = ?, updated_ms = ? WHERE node = ?", (actor, now, node))
            c = self.conn.execute(
                "INSERT INTO heal_transitions(node, from_state, to_state, reason, incident_id, actor, at_ms) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (node, cur.state, cur.state, reason, cur.incident_id, actor, now),
            )
            tid = c.lastrowid
            assert tid is not None
        log.info("heal_external_drain", node=node, actor=actor, state=str(cur.state), reason=reason)
        return Transition(tid, node, cur.state, cur.state, reason, cur.incident_id, actor, now)

    def reset_repair_loops(self, node: str, actor: str) -> None:
        """A person vouches for the node (new board, RMA replacement): start counting again."""
        if not is_human(actor):
            raise ValueError(f"only a named person may reset repair loops, not {actor!r}")
        with transaction(self.conn):
            self.conn.execute(
                "UPDATE heal_nodes SET repair_loops = 0, updated_ms = ? WHERE node = ?", (self.clock.time_ms(), node)
            )
        log.info("heal_repair_loops_reset", node=node, actor=actor)

    def history(self, node: str, since_ms: int | None = None) -> list[Transition]:
        """The node's transitions, oldest first (optionally only those at or after ``since_ms``)."""
        rows = self.conn.execute(
            "SELECT id, node, from_state, to_state, reason, incident_id, actor, at_ms FROM heal_transitions "
            "WHERE node = ? AND at_ms >= ? ORDER BY id",
            (node, since_ms if since_ms is not None else -(2**62)),
        )
        return [Transition(r[0], r[1], NodeHealState(r[2]), NodeHealState(r[3]), r[4], r[5], r[6], r[7]) for r in rows]

    # -- pending actions -------------------------------------------------------------------

    def plan_action(
        self, node: str, kind: str, incident_id: str | None = None, job: str | None = None
    ) -> PendingAction:
        """Log an action before performing it. Planning the same (node, kind, incident, job)
        again returns the existing row (a failed one goes back to planned for a retry), so a
        replayed decision does not plan a second copy."""
        if kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {kind!r} (expected one of {', '.join(ACTION_KINDS)})")
        now = self.clock.time_ms()
        with transaction(self.conn):
            row = self.conn.execute(
                "SELECT action_id, status FROM heal_pending_actions WHERE node = ? AND kind = ? "
                "AND incident_id IS ? AND job IS ? ORDER BY seq DESC LIMIT 1",
                (node, kind, incident_id, job),
            ).fetchone()
            if row is not None:
                if row[1] == "failed":
                    self.conn.execute(
                        "UPDATE heal_pending_actions SET status = 'planned', updated_ms = ? WHERE action_id = ?",
                        (now, row[0]),
                    )
                action = self._action(row[0])
                assert action is not None
                return action
            cur = self.conn.execute(
                "INSERT INTO heal_pending_actions(node, kind, incident_id, job, status, attempts, created_ms, "
                "updated_ms) VALUES (?, ?, ?, ?, 'planned', 0, ?, ?)",
                (node, kind, incident_id, job, now, now),
            )
            seq = cur.lastrowid
            assert seq is not None
            action_id = f"act-{seq:06d}"
            self.conn.execute("UPDATE heal_pending_actions SET action_id = ? WHERE seq = ?", (action_id, seq))
        log.info("heal_action_planned", action_id=action_id, node=node, kind=kind, incident=incident_id, job=job)
        action = self._action(action_id)
        assert action is not None
        return action

    def mark_action(self, action_id: str, status: str, error: str | None = None) -> PendingAction:
        """Record the outcome of one attempt: ``done`` or ``failed`` (with ``error``), or back to ``planned``."""
        if status not in ACTION_STATUSES:
            raise ValueError(f"unknown action status {status!r} (expected one of {', '.join(ACTION_STATUSES)})")
        with transaction(self.conn):
            cur = self.conn.execute(
                "UPDATE heal_pending_actions SET status = ?, attempts = attempts + ?, last_error = ?, updated_ms = ? "
                "WHERE action_id = ?",
                (status, 0 if status == "planned" else 1, error, self.clock.time_ms(), action_id),
            )
            if cur.rowcount == 0:
                raise KeyError(f"no pending action {action_id!r}")
        log.info("heal_action_marked", action_id=action_id, status=status, error=error)
        action = self._action(action_id)
        assert action is not None
        return action

    def planned(self) -> list[PendingAction]:
        """Actions planned but not yet marked, in planning order: what a restart replays."""
        ids = [
            r[0]
            for r in self.conn.execute(
                "SELECT action_id FROM heal_pending_actions WHERE status = 'planned' ORDER BY seq"
            )
        ]
        return [a for a in (self._action(i) for i in ids) if a is not None]

    def actions(self, node: str | None = None) -> list[PendingAction]:
        """Every logged action (optionally of one node), in planning order."""
        q = "SELECT action_id FROM heal_pending_actions" + (" WHERE node = ?" if node else "") + " ORDER BY seq"
        ids = [r[0] for r in self.conn.execute(q, (node,) if node else ())]
        return [a for a in (self._action(i) for i in ids) if a is not None]

    def _action(self, action_id: str) -> PendingAction | None:
        r = self.conn.execute(
            "SELECT action_id, node, kind, incident_id, job, status, attempts, last_error, created_ms, updated_ms "
            "FROM heal_pending_actions WHERE action_id = ?",
            (action_id,),
        ).fetchone()
        return PendingAction(*r) if r else None
