"""SQLite store (WAL) for nodes, inventory and events.

One writer (the controller's event loop). An event and the node's new ack position
are committed in one transaction, so after a crash the controller never acks what it
did not keep, and never keeps what it will ask for again.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Collection, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import structlog

from starpulse.core.schema import ConfigError
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)


@contextmanager
def transaction(db: sqlite3.Connection) -> Iterator[None]:
    """BEGIN IMMEDIATE/COMMIT on an autocommit connection, ROLLBACK on error; joins an open one.

    The one transaction helper of the controller's SQLite file. IMMEDIATE takes the write
    lock up front, so two controllers sharing the file cannot both read "unallocated" and
    then both write (spares, approvals), and a reader never has to upgrade its lock.
    """
    own = not db.in_transaction
    if own:
        db.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        if own:
            db.execute("ROLLBACK")
        raise
    if own:
        db.execute("COMMIT")


SCHEMA_VERSION = 1

_SCHEMA = """
CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS nodes (
    node_id TEXT PRIMARY KEY,
    role INTEGER NOT NULL,
    state TEXT NOT NULL,
    first_seen_ms INTEGER NOT NULL,
    last_seen_ms INTEGER NOT NULL,
    agent_version TEXT NOT NULL DEFAULT '',
    hostname TEXT NOT NULL DEFAULT '',
    inventory BLOB,
    buffer_epoch TEXT NOT NULL DEFAULT '',
    acked_event_seq INTEGER NOT NULL DEFAULT 0
);
-- Last-seen times apart from the nodes row: a nodes row carries the inventory (~13 kB), and
-- rewriting it for a timestamp cost ~0.1 ms a node, 28 ms a sweep at 10,000 nodes (bench.scale).
CREATE TABLE IF NOT EXISTS node_last_seen (
    node_id TEXT PRIMARY KEY,
    last_seen_ms INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS events (
    node_id TEXT NOT NULL,
    epoch TEXT NOT NULL,
    seq INTEGER NOT NULL,
    timestamp_ms INTEGER NOT NULL,
    received_ms INTEGER NOT NULL,
    kind INTEGER NOT NULL,
    severity INTEGER NOT NULL,
    component TEXT NOT NULL,
    payload BLOB NOT NULL,
    PRIMARY KEY (node_id, epoch, seq)
);
CREATE INDEX IF NOT EXISTS events_received ON events(received_ms);
CREATE INDEX IF NOT EXISTS events_node_received ON events(node_id, received_ms);
"""


@dataclass
class StoredNode:
    node_id: str
    role: int
    state: str
    first_seen_ms: int
    last_seen_ms: int
    agent_version: str
    hostname: str
    inventory: ipb.Inventory
    buffer_epoch: str
    acked_event_seq: int


@dataclass
class StoredEventRow:
    node_id: str
    event: tpb.Event
    received_ms: int


class StoreError(ConfigError):
    """The database is unusable (corrupt, wrong schema version, unwritable): one line naming the
    file and what to do, which the CLI prints as it prints a bad settings file (exit 2)."""


def damaged_store_advice(path: str | Path, problem: object) -> str:
    """The one line for a damaged controller database: the file, the problem and the way out."""
    return (
        f"controller database {path} is damaged ({problem}): stop the controller, keep a copy, then either"
        f" recover what is intact (sqlite3 {path} .recover | sqlite3 {path}.recovered, then use that file)"
        f" or move it aside to start empty (incidents and history stay in the copy; agents resend what"
        f" was not acked)"
    )


class Store:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if str(path) != ":memory:":
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._checkpointer: tuple[threading.Thread, threading.Event] | None = None
        try:
            self._db = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(
                f"cannot open controller database {path}: {exc} (check the folder and its permissions)"
            ) from None
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.execute("PRAGMA busy_timeout=5000")
            # A truncated or garbled file is found here, at start, with one line saying what to
            # do, not by the first query that touches a bad page (an internal error mid-run).
            (check,) = self._db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(check)
            self._db.executescript(_SCHEMA)
            self._check_version()
        except sqlite3.OperationalError as exc:  # locked by another process, read-only, disk full
            self._db.close()
            raise StoreError(f"cannot use controller database {path}: {exc}") from None
        except sqlite3.DatabaseError as exc:  # not a database, malformed, failed its check
            self._db.close()
            raise StoreError(damaged_store_advice(path, exc)) from None

    def _check_version(self) -> None:
        row = self._db.execute("SELECT version FROM schema_version").fetchone()
        if row is None:
            self._db.execute("INSERT INTO schema_version(version) VALUES (?)", (SCHEMA_VERSION,))
        elif int(row[0]) != SCHEMA_VERSION:
            raise StoreError(f"store {self.path} has schema version {row[0]}, this controller needs {SCHEMA_VERSION}")

    # -- nodes --------------------------------------------------------------------
    def upsert_node(self, node: StoredNode) -> None:
        self._db.execute(
            """INSERT INTO nodes(node_id, role, state, first_seen_ms, last_seen_ms, agent_version,
                                 hostname, inventory, buffer_epoch, acked_event_seq)
               VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
               ON CONFLICT(node_id) DO UPDATE SET
                 role=excluded.role, state=excluded.state, last_seen_ms=excluded.last_seen_ms,
                 agent_version=excluded.agent_version, hostname=excluded.hostname,
                 inventory=excluded.inventory, buffer_epoch=excluded.buffer_epoch,
                 acked_event_seq=excluded.acked_event_seq""",
            (
                node.node_id,
                node.role,
                node.state,
                node.first_seen_ms,
                node.last_seen_ms,
                node.agent_version,
                node.hostname,
                node.inventory.SerializeToString(),
                node.buffer_epoch,
                node.acked_event_seq,
            ),
        )

    def update_presence(
        self, rows: Iterable[tuple[str, str, int]], state_changed: Collection[str] | None = None
    ) -> None:
        """Batch update of (node_id, state, last_seen_ms): one transaction per sweep.

        The time goes to the small node_last_seen row; the nodes row (with the inventory) is
        rewritten only when the state really changed. ``state_changed`` (node ids) lets the
        caller say which states may have changed; None: any.
        """
        rows = list(rows)
        states = rows if state_changed is None else [r for r in rows if r[0] in state_changed]
        self._db.execute("BEGIN")
        try:
            self._db.executemany(
                """INSERT INTO node_last_seen(node_id, last_seen_ms) VALUES (?, ?)
                   ON CONFLICT(node_id) DO UPDATE SET last_seen_ms = excluded.last_seen_ms""",
                [(node_id, seen) for node_id, _, seen in rows],
            )
            self._db.executemany(
                "UPDATE nodes SET state = ? WHERE node_id = ? AND state IS NOT ?",
                [(state, node_id, state) for node_id, state, _ in states],
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise

    def load_nodes(self) -> list[StoredNode]:
        out = []
        for row in self._db.execute(
            """SELECT n.node_id, n.role, n.state, n.first_seen_ms, MAX(n.last_seen_ms, COALESCE(s.last_seen_ms, 0)),
                      n.agent_version, n.hostname, n.inventory, n.buffer_epoch, n.acked_event_seq
               FROM nodes n LEFT JOIN node_last_seen s ON s.node_id = n.node_id ORDER BY n.node_id"""
        ):
            inventory = ipb.Inventory()
            if row[7]:
                inventory.ParseFromString(row[7])
            out.append(
                StoredNode(
                    node_id=row[0],
                    role=row[1],
                    state=row[2],
                    first_seen_ms=row[3],
                    last_seen_ms=row[4],
                    agent_version=row[5],
                    hostname=row[6],
                    inventory=inventory,
                    buffer_epoch=row[8],
                    acked_event_seq=row[9],
                )
            )
        return out

    # -- events -------------------------------------------------------------------
    def insert_events(
        self, node_id: str, epoch: str, events: list[tpb.Event], received_ms: int, acked_event_seq: int
    ) -> int:
        """Store events and the node's new ack position atomically; returns rows inserted.

        INSERT OR IGNORE makes a replayed (node, epoch, seq) a no-op: idempotent ingest.
        """
        self._db.execute("BEGIN")
        try:
            inserted = 0
            for ev in events:
                cur = self._db.execute(
                    """INSERT OR IGNORE INTO events(node_id, epoch, seq, timestamp_ms, received_ms,
                                                    kind, severity, component, payload)
                       VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                    (
                        node_id,
                        epoch,
                        ev.seq,
                        ev.timestamp_ms,
                        received_ms,
                        ev.kind,
                        ev.severity,
                        ev.component,
                        ev.SerializeToString(),
                    ),
                )
                inserted += cur.rowcount
            self._db.execute(
                "UPDATE nodes SET acked_event_seq = ?, buffer_epoch = ? WHERE node_id = ?",
                (acked_event_seq, epoch, node_id),
            )
            self._db.execute("COMMIT")
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        return inserted

    def list_events(self, node_id: str | None = None, limit: int = 100) -> list[StoredEventRow]:
        """Newest first."""
        if node_id:
            cursor = self._db.execute(
                """SELECT node_id, payload, received_ms FROM events WHERE node_id = ?
                   ORDER BY received_ms DESC, seq DESC LIMIT ?""",
                (node_id, limit),
            )
        else:
            cursor = self._db.execute(
                "SELECT node_id, payload, received_ms FROM events ORDER BY received_ms DESC, seq DESC LIMIT ?",
                (limit,),
            )
        out = []
        for nid, payload, received in cursor:
            ev = tpb.Event()
            ev.ParseFromString(payload)
            out.append(StoredEventRow(nid, ev, received))
        return out

    def last_event_seq(self, node_id: str, epoch: str) -> int:
        """The highest seq stored for ``node_id`` in buffer epoch ``epoch`` (0: none); one index probe."""
        (seq,) = self._db.execute(
            "SELECT MAX(seq) FROM events WHERE node_id = ? AND epoch = ?", (node_id, epoch)
        ).fetchone()
        return int(seq or 0)

    def count_events(self, node_id: str | None = None) -> int:
        if node_id:
            (n,) = self._db.execute("SELECT COUNT(*) FROM events WHERE node_id = ?", (node_id,)).fetchone()
        else:
            (n,) = self._db.execute("SELECT COUNT(*) FROM events").fetchone()
        return int(n)

    def recent_event_counts(self, since_ms: int, min_severity: int) -> dict[str, int]:
        """Events per node received since since_ms at or above a severity."""
        rows = self._db.execute(
            """SELECT node_id, COUNT(*) FROM events WHERE received_ms >= ? AND severity >= ?
               GROUP BY node_id""",
            (since_ms, min_severity),
        )
        return {nid: int(n) for nid, n in rows}

    @property
    def connection(self) -> sqlite3.Connection:
        """The one connection; other controller stores (incidents, remediation) add their tables to it."""
        return self._db

    def start_checkpointer(self, every_s: float = 5.0) -> None:
        """Checkpoint the WAL from a thread of its own instead of inside a commit.

        SQLite checkpoints automatically in whichever commit grows the WAL past 1,000 pages,
        and a checkpoint writes those pages back and fsyncs: on the controller's event loop
        that stalled a presence flush up to ~100 ms now and then (starpulse_periodic_seconds
        at 10,000 nodes). A PASSIVE checkpoint on another connection does not block writers.
        """
        if str(self.path) == ":memory:" or self._checkpointer is not None:
            return
        self._db.execute("PRAGMA wal_autocheckpoint=0")
        stop = threading.Event()
        thread = threading.Thread(
            target=self._checkpoint_loop, args=(stop, every_s), name="wal-checkpoint", daemon=True
        )
        self._checkpointer = (thread, stop)
        thread.start()

    def _checkpoint_loop(self, stop: threading.Event, every_s: float) -> None:
        conn = sqlite3.connect(str(self.path), isolation_level=None)
        try:
            conn.execute("PRAGMA busy_timeout=5000")
            while not stop.wait(every_s):
                try:
                    conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
                except sqlite3.Error as exc:
                    log.warning("wal_checkpoint_failed", error=str(exc))
        finally:
            conn.close()

    def close(self) -> None:
        if self._checkpointer is not None:
            thread, stop = self._checkpointer
            stop.set()
            thread.join(timeout=10)
            self._checkpointer = None
            self._db.execute("PRAGMA wal_autocheckpoint=1000")  # the default again: close checkpoints
        self._db.close()
