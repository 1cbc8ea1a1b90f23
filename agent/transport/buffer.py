"""A bounded on-disk event buffer: events wait here until the controller acks them.

SQLite (WAL, synchronous=FULL) so an agent or host crash loses nothing that was
accepted. Sequence numbers are assigned here and survive restarts; the buffer has an
epoch (random id made when the file is created) so the controller can tell a reset
buffer from a replay.
"""

from __future__ import annotations

import sqlite3
import threading
import uuid
from pathlib import Path

import structlog

from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL);
"""


class EventBuffer:
    """Durable FIFO of events keyed by a contiguous per-node sequence number."""

    def __init__(self, path: str | Path, max_events: int = 100_000) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_events = max_events
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=FULL")
        self._db.executescript(_SCHEMA)
        self.epoch = self._meta("epoch") or self._init_meta()
        self._next_seq = int(self._meta("next_seq") or "1")
        self.dropped_total = int(self._meta("dropped_total") or "0")

    def _meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def _set_meta(self, key: str, value: str) -> None:
        self._db.execute("INSERT OR REPLACE INTO meta(key, value) VALUES (?, ?)", (key, value))

    def _init_meta(self) -> str:
        epoch = uuid.uuid4().hex
        self._db.execute("BEGIN IMMEDIATE")
        self._set_meta("epoch", epoch)
        self._set_meta("next_seq", "1")
        self._db.execute("COMMIT")
        return epoch

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def get_meta(self, key: str) -> str | None:
        """A value stored with append(meta=...) (e.g. the kernel-log cursor)."""
        with self._lock:
            return self._meta("user:" + key)

    def append(self, event: tpb.Event, meta: dict[str, str] | None = None) -> tpb.Event:
        """Assign the next sequence number, store durably, and return the numbered event.

        ``meta`` is written in the same transaction (a source's read cursor), so a crash
        can never keep the event and lose the cursor or the other way round. When full,
        the oldest events are dropped (and counted): a bounded disk footprint matters
        more on a GPU node than a week-old XID.
        """
        with self._lock:
            numbered = tpb.Event()
            numbered.CopyFrom(event)
            numbered.seq = self._next_seq
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "INSERT INTO events(seq, payload) VALUES (?, ?)",
                    (numbered.seq, numbered.SerializeToString()),
                )
                self._set_meta("next_seq", str(numbered.seq + 1))
                for key, value in (meta or {}).items():
                    self._set_meta("user:" + key, value)
                dropped = self._trim_locked()
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._next_seq = numbered.seq + 1
            if dropped:
                self.dropped_total += dropped
                log.warning("event_buffer_overflow", dropped=dropped, max_events=self.max_events)
            return numbered

    def _trim_locked(self) -> int:
        (count,) = self._db.execute("SELECT COUNT(*) FROM events").fetchone()
        excess = int(count) - self.max_events
        if excess <= 0:
            return 0
        self._db.execute("DELETE FROM events WHERE seq IN (SELECT seq FROM events ORDER BY seq LIMIT ?)", (excess,))
        total = int(self._meta("dropped_total") or "0") + excess
        self._set_meta("dropped_total", str(total))
        return excess

    def pending(self, after_seq: int, limit: int = 500) -> list[tpb.Event]:
        """Buffered events with seq > after_seq, oldest first."""
        with self._lock:
            rows = self._db.execute(
                "SELECT payload FROM events WHERE seq > ? ORDER BY seq LIMIT ?", (after_seq, limit)
            ).fetchall()
        out = []
        for (payload,) in rows:
            ev = tpb.Event()
            ev.ParseFromString(payload)
            out.append(ev)
        return out

    def ack(self, seq: int) -> int:
        """Forget every event with seq ≤ the controller's ack; returns how many."""
        with self._lock:
            cur = self._db.execute("DELETE FROM events WHERE seq <= ?", (seq,))
            return cur.rowcount

    def oldest_seq(self) -> int:
        """Lowest seq still buffered, or next_seq when empty."""
        with self._lock:
            (low,) = self._db.execute("SELECT MIN(seq) FROM events").fetchone()
        return self._next_seq if low is None else int(low)

    def depth(self) -> int:
        with self._lock:
            (count,) = self._db.execute("SELECT COUNT(*) FROM events").fetchone()
        return int(count)

    def close(self) -> None:
        with self._lock:
            self._db.close()
