"""Who acknowledged which incident: a person saying "I am on it" (``starpulse incident ack``).

Kept apart from the incident rows (detection's) because an acknowledgement is a person's
act about the remediation, not a fact the detectors found; it rides the same SQLite file,
so the etcd mirror carries it to a standby like every heal table.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

from controller.store import transaction

_SCHEMA = """
CREATE TABLE IF NOT EXISTS heal_incident_acks (
    incident_id TEXT PRIMARY KEY,
    actor TEXT NOT NULL,
    reason TEXT NOT NULL,
    at_ms INTEGER NOT NULL
);
"""


@dataclass(frozen=True)
class Ack:
    incident_id: str
    actor: str
    reason: str
    at_ms: int


def ensure_schema(conn: sqlite3.Connection) -> None:
    conn.executescript(_SCHEMA)


def acknowledge(conn: sqlite3.Connection, incident_id: str, actor: str, reason: str, at_ms: int) -> Ack:
    """Record (or re-record: the latest person wins) an acknowledgement."""
    ensure_schema(conn)
    with transaction(conn):
        conn.execute(
            "INSERT INTO heal_incident_acks(incident_id, actor, reason, at_ms) VALUES (?, ?, ?, ?) "
            "ON CONFLICT(incident_id) DO UPDATE SET actor = excluded.actor, reason = excluded.reason, "
            "at_ms = excluded.at_ms",
            (incident_id, actor, reason, at_ms),
        )
    return Ack(incident_id, actor, reason, at_ms)


def ack_of(conn: sqlite3.Connection, incident_id: str) -> Ack | None:
    try:
        row = conn.execute(
            "SELECT incident_id, actor, reason, at_ms FROM heal_incident_acks WHERE incident_id = ?", (incident_id,)
        ).fetchone()
    except sqlite3.OperationalError:  # no table yet: nobody acknowledged anything
        return None
    return Ack(*row) if row else None
