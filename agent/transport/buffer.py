"""A bounded on-disk event buffer: events wait here until the controller acks them.

SQLite (WAL, synchronous=FULL) so an agent or host crash loses nothing that was
accepted. Sequence numbers are assigned here and survive restarts; the buffer has an
epoch (random id made when the file is created) so the controller can tell a reset
buffer from a replay.

A damaged file (truncated, garbled, not a database) never stops the agent: it is moved aside
with a timestamp, a fresh buffer (a new epoch) starts, and its first event says so
(``EVENT_KIND_BUFFER_RESET``: where the old file went and how many unsent events it may have
held), so the controller alerts and nobody has to delete a file to end a restart loop.
"""

from __future__ import annotations

import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import structlog

from starpulse.core.eventlimits import fit_event
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY, payload BLOB NOT NULL);
"""


@dataclass(frozen=True)
class BufferReset:
    """A damaged buffer file moved aside at start: where it went, why, and what it may have held."""

    moved_to: Path
    reason: str
    lost: int | None  # unsent events the old file held; None: it could not be read at all


class EventBuffer:
    """Durable FIFO of events keyed by a contiguous per-node sequence number."""

    def __init__(self, path: str | Path, max_events: int = 100_000) -> None:
        if max_events < 1:
            raise ValueError("max_events must be at least 1")
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.max_events = max_events
        self._lock = threading.Lock()
        self.reset: BufferReset | None = None  # set when a damaged file was moved aside at start
        try:
            self._open()
        except (sqlite3.DatabaseError, ValueError) as exc:
            self.reset = self._move_aside(str(exc) or type(exc).__name__)
            self._open()
            self._announce_reset(self.reset)

    def _open(self) -> None:
        """Open the file, checked: a file SQLite cannot read whole raises DatabaseError here, not later."""
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        try:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(_SCHEMA)
            (check,) = self._db.execute("PRAGMA quick_check").fetchone()
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check}")
            self.epoch = self._meta("epoch") or self._init_meta()
            self._next_seq = int(self._meta("next_seq") or "1")
            self.dropped_total = int(self._meta("dropped_total") or "0")
        except BaseException:
            self._db.close()
            raise

    def _move_aside(self, reason: str) -> BufferReset:
        """Move the damaged file (and its WAL and shared-memory files) aside, named with the time."""
        lost = _count_readable(self.path)
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        moved_to = self.path.with_name(f"{self.path.name}.damaged-{stamp}")
        for suffix in ("", "-wal", "-shm"):
            src = self.path.with_name(self.path.name + suffix)
            if src.exists():
                src.rename(self.path.with_name(f"{self.path.name}{suffix}.damaged-{stamp}"))
        log.error(
            "event_buffer_damaged",
            path=str(self.path),
            moved_to=str(moved_to),
            reason=reason,
            unsent_events_lost="unknown" if lost is None else lost,
        )
        return BufferReset(moved_to, reason, lost)

    def _announce_reset(self, reset: BufferReset) -> None:
        """The fresh buffer's first event: the controller hears of the damage (and alerts)."""
        lost = "unknown" if reset.lost is None else str(reset.lost)
        event = tpb.Event(
            timestamp_ms=int(time.time() * 1000),
            kind=tpb.EVENT_KIND_BUFFER_RESET,
            severity=tpb.SEVERITY_WARNING,
            component="agent",
            message=(
                f"the agent's event buffer was damaged ({reset.reason[:200]}); moved to {reset.moved_to.name},"
                f" a fresh one started; unsent events it may have held: {lost}"
            ),
        )
        event.attributes["moved_to"] = reset.moved_to.name
        event.attributes["lost"] = lost
        self.append(event)

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
            # The controller's own limits: an event past them would end the stream at every
            # resend, so it is cut to fit here, once, before it is stored.
            cuts = fit_event(numbered)
            if cuts:
                log.warning(
                    "event_fitted_to_limits",
                    kind=tpb.EventKind.Name(numbered.kind),
                    component=numbered.component,
                    cut=cuts[:8],
                )
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


def _count_readable(path: Path) -> int | None:
    """How many events a damaged buffer still shows, read-only; None when it cannot be read."""
    try:
        db = sqlite3.connect(path.resolve().as_uri() + "?mode=ro", uri=True)
    except sqlite3.Error:
        return None
    try:
        (count,) = db.execute("SELECT COUNT(*) FROM events").fetchone()
        return int(count)
    except sqlite3.Error:
        return None
    finally:
        db.close()
