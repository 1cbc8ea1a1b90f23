"""A persistent outbox of notifications in the controller's SQLite database.

Why a table and not a queue in memory: a notification is written in the same process
step that learns of the incident change, and only leaves the table once a receiver has
answered 2xx, so alerts survive a controller restart and a receiver outage.

- ``notify_outbox``: one row per notification; unique on (receiver, dedup_key, status),
  so the same notice is never queued twice however often the change is re-published.
  Rows are delivered in id order within (receiver, grp), ``grp`` being the incident:
  a resolved notice is never sent before that incident's firing one, even while the
  firing one waits out a backoff.
- ``notify_state``: per (receiver, incident) whether we last told the receiver it was
  firing or resolved, which *episode* it is in (an incident reopened after resolving is
  a new episode, so its new firing notice is not mistaken for a duplicate), and the
  current alert payload. The Alertmanager API re-send reads its active alerts from here,
  so re-sending survives a restart too.

Delivery is at least once: a crash between a 2xx and ``mark_delivered`` sends that notice
again after restart, under the same ``delivery_id``, which receivers deduplicate on.

The caller owns the connection (autocommit, as the controller's store opens it).
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import structlog

from controller.store import transaction
from starpulse.core.clock import Clock

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notify_outbox (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    receiver TEXT NOT NULL,
    grp TEXT NOT NULL,
    dedup_key TEXT NOT NULL,
    status TEXT NOT NULL,
    delivery_id TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_ms INTEGER NOT NULL,
    created_ms INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL,
    delivered_ms INTEGER,
    last_error TEXT NOT NULL DEFAULT '',
    UNIQUE (receiver, dedup_key, status)
);
CREATE INDEX IF NOT EXISTS notify_outbox_due ON notify_outbox(state, next_attempt_ms);
CREATE INDEX IF NOT EXISTS notify_outbox_grp ON notify_outbox(receiver, grp, state, id);
CREATE TABLE IF NOT EXISTS notify_state (
    receiver TEXT NOT NULL,
    incident_id TEXT NOT NULL,
    episode INTEGER NOT NULL,
    revision INTEGER NOT NULL,
    state TEXT NOT NULL,
    severity TEXT NOT NULL,
    payload TEXT NOT NULL,
    updated_ms INTEGER NOT NULL,
    PRIMARY KEY (receiver, incident_id)
);
"""


PENDING = "pending"
DELIVERED = "delivered"
FAILED = "failed"  # given up: a 4xx other than 429, or max_attempts reached

_ITEM_COLUMNS = (
    "id, receiver, grp, dedup_key, status, delivery_id, payload, state, attempts, next_attempt_ms, "
    "created_ms, updated_ms, delivered_ms, last_error"
)


@dataclass
class OutboxItem:
    id: int
    receiver: str
    group: str  # ordering group: the incident id
    dedup_key: str
    status: str  # "firing" | "resolved"
    delivery_id: str  # stable across retries and restarts: receivers drop duplicates on it
    payload: str  # JSON text
    state: str
    attempts: int
    next_attempt_ms: int
    created_ms: int
    updated_ms: int
    delivered_ms: int | None
    last_error: str


@dataclass
class ActiveAlert:
    """What ``notify_state`` knows about one incident for one receiver."""

    receiver: str
    incident_id: str
    episode: int  # bumped when a resolved incident reopens
    revision: int  # bumped when the labels we sent changed (severity) within an episode
    state: str  # "firing" | "resolved"
    severity: str
    payload: str  # JSON of the current alert (for the API re-send)
    updated_ms: int


def delivery_id(receiver: str, dedup_key: str, status: str) -> str:
    """Deterministic: the same notification gets the same id even if it were ever queued again."""
    return hashlib.sha256(f"{receiver}\x00{dedup_key}\x00{status}".encode()).hexdigest()[:32]


class Outbox:
    """Notifications waiting for (or done with) delivery, on a caller-owned SQLite connection."""

    def __init__(self, conn: sqlite3.Connection, clock: Clock) -> None:
        self._db = conn
        self.clock = clock  # the notifier's too, unless it is given its own
        self._clock = clock.time_ms
        self._db.executescript(_SCHEMA)

    # -- the queue ---------------------------------------------------------------------

    def enqueue(
        self,
        receiver: str,
        dedup_key: str,
        status: str,
        payload_json: str,
        group: str | None = None,
    ) -> int | None:
        """Queue a notification; returns its id, or None when (receiver, dedup_key, status) is already queued."""
        now = self._clock()
        cur = self._db.execute(
            """INSERT OR IGNORE INTO notify_outbox
                   (receiver, grp, dedup_key, status, delivery_id, payload, next_attempt_ms, created_ms, updated_ms)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
            (
                receiver,
                group if group is not None else dedup_key,
                dedup_key,
                status,
                delivery_id(receiver, dedup_key, status),
                payload_json,
                now,
                now,
                now,
            ),
        )
        if cur.rowcount == 0:
            log.debug("notify_duplicate_ignored", receiver=receiver, dedup_key=dedup_key, status=status)
            return None
        return cur.lastrowid

    _HEAD = f"""SELECT {_ITEM_COLUMNS} FROM notify_outbox o
        WHERE o.state = 'pending' AND o.next_attempt_ms <= ?
          AND NOT EXISTS (SELECT 1 FROM notify_outbox p
                          WHERE p.receiver = o.receiver AND p.grp = o.grp AND p.state = 'pending' AND p.id < o.id)"""

    def due(self, now: int | None = None, limit: int = 100, receiver: str | None = None) -> list[OutboxItem]:
        """Pending items whose time has come and that no earlier pending item of their group holds back.

        At most one item per (receiver, group) is returned, so they can be sent concurrently
        without reordering an incident's notices.
        """
        t = self._clock() if now is None else now
        sql, args = self._HEAD, [t]
        if receiver is not None:
            sql += " AND o.receiver = ?"
            args.append(receiver)  # type: ignore[arg-type]
        rows = self._db.execute(sql + " ORDER BY o.next_attempt_ms, o.id LIMIT ?", (*args, limit))
        return [OutboxItem(*r) for r in rows]

    def next_due_ms(self) -> int | None:
        """When the earliest deliverable item falls due (None: nothing pending)."""
        row = self._db.execute(
            """SELECT MIN(o.next_attempt_ms) FROM notify_outbox o WHERE o.state = 'pending'
               AND NOT EXISTS (SELECT 1 FROM notify_outbox p WHERE p.receiver = o.receiver
                               AND p.grp = o.grp AND p.state = 'pending' AND p.id < o.id)"""
        ).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def mark_delivered(self, item_id: int) -> None:
        now = self._clock()
        self._db.execute(
            """UPDATE notify_outbox SET state = 'delivered', attempts = attempts + 1, delivered_ms = ?,
                   updated_ms = ?, last_error = '' WHERE id = ?""",
            (now, now, item_id),
        )

    def mark_failed(self, item_id: int, error: str, next_attempt_ms: int | None) -> None:
        """Record a failed attempt: retry at ``next_attempt_ms``, or give up for good when it is None."""
        now = self._clock()
        if next_attempt_ms is None:
            self._db.execute(
                """UPDATE notify_outbox SET state = 'failed', attempts = attempts + 1, updated_ms = ?,
                       last_error = ? WHERE id = ?""",
                (now, error[:500], item_id),
            )
        else:
            self._db.execute(
                """UPDATE notify_outbox SET attempts = attempts + 1, next_attempt_ms = ?, updated_ms = ?,
                       last_error = ? WHERE id = ?""",
                (next_attempt_ms, now, error[:500], item_id),
            )

    def pending_count(self, receiver: str | None = None) -> int:
        """Notifications not yet delivered nor given up: the queue-depth gauge."""
        if receiver is None:
            (n,) = self._db.execute("SELECT COUNT(*) FROM notify_outbox WHERE state = 'pending'").fetchone()
        else:
            (n,) = self._db.execute(
                "SELECT COUNT(*) FROM notify_outbox WHERE state = 'pending' AND receiver = ?", (receiver,)
            ).fetchone()
        return int(n)

    def get(self, item_id: int) -> OutboxItem | None:
        row = self._db.execute(f"SELECT {_ITEM_COLUMNS} FROM notify_outbox WHERE id = ?", (item_id,)).fetchone()
        return OutboxItem(*row) if row else None

    def items(self, receiver: str | None = None, group: str | None = None) -> list[OutboxItem]:
        """Every row, oldest first (inspection, tests, an operator's API)."""
        sql, args = f"SELECT {_ITEM_COLUMNS} FROM notify_outbox WHERE 1 = 1", []
        if receiver is not None:
            sql += " AND receiver = ?"
            args.append(receiver)
        if group is not None:
            sql += " AND grp = ?"
            args.append(group)
        return [OutboxItem(*r) for r in self._db.execute(sql + " ORDER BY id", args)]

    def purge(self, before_ms: int) -> int:
        """Drop finished rows older than ``before_ms`` whose incident is no longer firing anywhere.

        Rows of firing incidents are kept, since they are what makes a re-published change a duplicate.
        """
        with transaction(self._db):
            cur = self._db.execute(
                """DELETE FROM notify_outbox WHERE state != 'pending' AND updated_ms < ?
                   AND NOT EXISTS (SELECT 1 FROM notify_state s WHERE s.receiver = notify_outbox.receiver
                                   AND s.incident_id = notify_outbox.grp AND s.state = 'firing')""",
                (before_ms,),
            )
            n = cur.rowcount
            self._db.execute(
                """DELETE FROM notify_state WHERE state = 'resolved' AND updated_ms < ?
                   AND NOT EXISTS (SELECT 1 FROM notify_outbox o WHERE o.receiver = notify_state.receiver
                                   AND o.grp = notify_state.incident_id)""",
                (before_ms,),
            )
        return n

    # -- what each receiver was told ---------------------------------------------------

    def state(self, receiver: str, incident_id: str) -> ActiveAlert | None:
        row = self._db.execute(
            """SELECT receiver, incident_id, episode, revision, state, severity, payload, updated_ms FROM notify_state
               WHERE receiver = ? AND incident_id = ?""",
            (receiver, incident_id),
        ).fetchone()
        return ActiveAlert(*row) if row else None

    def set_state(
        self, receiver: str, incident_id: str, episode: int, revision: int, state: str, severity: str, payload: str
    ) -> None:
        self._db.execute(
            """INSERT INTO notify_state(receiver, incident_id, episode, revision, state, severity, payload, updated_ms)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(receiver, incident_id) DO UPDATE SET episode = excluded.episode,
                   revision = excluded.revision, state = excluded.state, severity = excluded.severity,
                   payload = excluded.payload, updated_ms = excluded.updated_ms""",
            (receiver, incident_id, episode, revision, state, severity, payload, self._clock()),
        )

    def active(self, receiver: str) -> list[ActiveAlert]:
        """Incidents this receiver was last told are firing, oldest first (the API re-send set)."""
        rows = self._db.execute(
            """SELECT receiver, incident_id, episode, revision, state, severity, payload, updated_ms FROM notify_state
               WHERE receiver = ? AND state = 'firing' ORDER BY incident_id""",
            (receiver,),
        )
        return [ActiveAlert(*r) for r in rows]

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """One transaction around several writes (a state change and its notice commit together)."""
        with transaction(self._db):
            yield
