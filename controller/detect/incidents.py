"""Incidents in the controller's SQLite database, so a restarted controller keeps them.

The caller owns the connection (the controller's store opens it with WAL on); this
module only adds its own tables. Every lifecycle step is also appended to an
``incident_history`` table, which is what an operator reads to see how an incident grew,
what it absorbed and why it closed.

Incident ids are ``inc-000123``: the row's autoincrement number, zero-padded, so they are
short, stable across restarts, never reused (AUTOINCREMENT), and sort in opening order.
"""

from __future__ import annotations

import json
import sqlite3
from typing import Any, cast

import structlog

from controller.detect.model import ComponentType, Incident, Severity

log = structlog.get_logger(__name__)

ID_PREFIX = "inc-"
ID_WIDTH = 6

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    id TEXT UNIQUE,
    kind TEXT NOT NULL,
    root_cause TEXT NOT NULL,
    component_type TEXT NOT NULL,
    affected_nodes TEXT NOT NULL,
    affected_jobs TEXT NOT NULL,
    severity TEXT NOT NULL,
    action TEXT NOT NULL,
    evidence TEXT NOT NULL,
    condition_keys TEXT NOT NULL,
    opened_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    resolved_ms INTEGER,
    merged_into TEXT
);
CREATE INDEX IF NOT EXISTS incidents_open ON incidents(resolved_ms);
CREATE TABLE IF NOT EXISTS incident_history (
    incident_id TEXT NOT NULL,
    ts_ms INTEGER NOT NULL,
    change TEXT NOT NULL,
    severity TEXT NOT NULL,
    detail TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS incident_history_id ON incident_history(incident_id, ts_ms);
"""

_COLUMNS = (
    "id, kind, root_cause, component_type, affected_nodes, affected_jobs, severity, action, "
    "evidence, condition_keys, opened_ms, updated_ms, resolved_ms"
)


def format_id(seq: int) -> str:
    return f"{ID_PREFIX}{seq:0{ID_WIDTH}d}"


class IncidentStore:
    """Persists ``Incident`` rows and their history on a caller-owned SQLite connection.

    The connection is expected in autocommit mode (``isolation_level=None``, as the
    controller's store opens it); each write here is one explicit transaction.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._db = conn
        self._db.executescript(_SCHEMA)

    # -- writes --------------------------------------------------------------------------

    def open(self, incident: Incident, detail: dict[str, Any] | None = None) -> Incident:
        """Insert a new incident; assigns ``incident.id`` when it is empty. Returns the incident."""
        with self._tx():
            if not incident.id:
                cur = self._db.execute(
                    f"INSERT INTO incidents({_COLUMNS}) VALUES (NULL, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    self._row(incident)[1:],
                )
                seq = cur.lastrowid
                assert seq is not None
                incident.id = format_id(seq)
                self._db.execute("UPDATE incidents SET id = ? WHERE seq = ?", (incident.id, seq))
            else:
                self._db.execute(
                    f"INSERT INTO incidents({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    self._row(incident),
                )
            self._history(incident, "opened", incident.opened_ms, detail)
        log.debug("incident_stored", id=incident.id, kind=incident.kind)
        return incident

    def update(self, incident: Incident, change: str = "updated", detail: dict[str, Any] | None = None) -> None:
        """Rewrite an incident's row (members, severity, reopen...) and log ``change`` in its history."""
        with self._tx():
            self._write(incident)
            self._history(incident, change, incident.updated_ms or incident.opened_ms, detail)

    def resolve(
        self,
        incident: Incident,
        resolved_ms: int,
        merged_into: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        """Close an incident; ``merged_into`` records which incident absorbed it."""
        incident.resolved_ms = resolved_ms
        incident.updated_ms = resolved_ms
        with self._tx():
            self._write(incident)
            self._db.execute("UPDATE incidents SET merged_into = ? WHERE id = ?", (merged_into, incident.id))
            info = dict(detail or {})
            if merged_into:
                info["merged_into"] = merged_into
            self._history(incident, "merged" if merged_into else "resolved", resolved_ms, info)

    def save(self, incident: Incident) -> Incident:
        """Insert or rewrite without a history entry (imports, repairs)."""
        if not incident.id or self.get(incident.id) is None:
            return self.open(incident)
        with self._tx():
            self._write(incident)
        return incident

    # -- reads ---------------------------------------------------------------------------

    def load_open(self) -> list[Incident]:
        """Incidents not yet resolved, oldest first: what a restarted controller resumes."""
        rows = self._db.execute(f"SELECT {_COLUMNS} FROM incidents WHERE resolved_ms IS NULL ORDER BY seq")
        return [self._incident(r) for r in rows]

    def list_incidents(self, active_only: bool = False, limit: int = 100) -> list[Incident]:
        """Newest first."""
        where = "WHERE resolved_ms IS NULL" if active_only else ""
        rows = self._db.execute(
            f"SELECT {_COLUMNS} FROM incidents {where} ORDER BY opened_ms DESC, seq DESC LIMIT ?", (limit,)
        )
        return [self._incident(r) for r in rows]

    def get(self, incident_id: str) -> Incident | None:
        row = self._db.execute(f"SELECT {_COLUMNS} FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return self._incident(row) if row else None

    def merged_into(self, incident_id: str) -> str | None:
        """The incident that absorbed this one, if it was closed by a merge."""
        row = self._db.execute("SELECT merged_into FROM incidents WHERE id = ?", (incident_id,)).fetchone()
        return row[0] if row else None

    def history(self, incident_id: str) -> list[dict[str, Any]]:
        """Lifecycle entries of one incident, oldest first."""
        rows = self._db.execute(
            "SELECT ts_ms, change, severity, detail FROM incident_history WHERE incident_id = ? ORDER BY rowid",
            (incident_id,),
        )
        return [{"ts_ms": t, "change": c, "severity": s, "detail": json.loads(d)} for t, c, s, d in rows]

    def count(self, active_only: bool = False) -> int:
        where = "WHERE resolved_ms IS NULL" if active_only else ""
        (n,) = self._db.execute(f"SELECT COUNT(*) FROM incidents {where}").fetchone()
        return int(n)

    # -- helpers -------------------------------------------------------------------------

    def _tx(self) -> _Transaction:
        return _Transaction(self._db)

    def _write(self, incident: Incident) -> None:
        row = self._row(incident)
        cur = self._db.execute(
            """UPDATE incidents SET kind = ?, root_cause = ?, component_type = ?, affected_nodes = ?,
                   affected_jobs = ?, severity = ?, action = ?, evidence = ?, condition_keys = ?,
                   opened_ms = ?, updated_ms = ?, resolved_ms = ? WHERE id = ?""",
            (*row[1:], incident.id),
        )
        if cur.rowcount == 0:
            raise KeyError(f"incident {incident.id!r} is not stored")

    def _history(self, incident: Incident, change: str, ts_ms: int, detail: dict[str, Any] | None) -> None:
        self._db.execute(
            "INSERT INTO incident_history(incident_id, ts_ms, change, severity, detail) VALUES (?, ?, ?, ?, ?)",
            (incident.id, ts_ms, change, incident.severity, json.dumps(detail or {}, sort_keys=True, default=str)),
        )

    @staticmethod
    def _row(i: Incident) -> tuple[Any, ...]:
        return (
            i.id,
            i.kind,
            i.root_cause,
            i.component_type,
            json.dumps(i.affected_nodes),
            json.dumps(i.affected_jobs),
            i.severity,
            i.action,
            json.dumps(i.evidence, sort_keys=True, default=str),
            json.dumps([list(k) for k in i.condition_keys]),
            i.opened_ms,
            i.updated_ms,
            i.resolved_ms,
        )

    @staticmethod
    def _incident(row: tuple[Any, ...]) -> Incident:
        return Incident(
            id=row[0],
            kind=row[1],
            root_cause=row[2],
            component_type=cast(ComponentType, row[3]),
            affected_nodes=list(json.loads(row[4])),
            affected_jobs=list(json.loads(row[5])),
            severity=cast(Severity, row[6]),
            action=row[7],
            evidence=list(json.loads(row[8])),
            opened_ms=int(row[10]),
            resolved_ms=None if row[12] is None else int(row[12]),
            condition_keys=[(str(a), str(b)) for a, b in json.loads(row[9])],
            updated_ms=int(row[11]),
        )


class _Transaction:
    """BEGIN/COMMIT around a block on an autocommit connection; ROLLBACK on any error.

    Falls back to the connection's own transaction when the caller is already inside one.
    """

    def __init__(self, db: sqlite3.Connection) -> None:
        self._db = db
        self._own = False

    def __enter__(self) -> None:
        if not self._db.in_transaction:
            self._db.execute("BEGIN")
            self._own = True

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._own:
            return
        self._db.execute("ROLLBACK" if exc_type is not None else "COMMIT")
