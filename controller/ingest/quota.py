"""What one node may write to the controller's disk per minute (issue 32).

The per-stream token bucket (``ratelimit``) paces messages; this bounds what is *stored*:
events per node per minute, by count and by bytes, so one node, or one imposter speaking as
it, cannot fill the controller's disk. A node over its quota has its stream ended with
RESOURCE_EXHAUSTED naming the limit; its agent keeps the events in its buffer and resends
them after its backoff, so a burst is delayed, never lost. Each minute a node was refused is
kept in ``ingest_quota`` (node, minute, what it wrote and how often it was refused) for a
week: who hit the limit, and when. Times come from the injected clock.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass

import structlog

from starpulse.core.clock import Clock

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS ingest_quota (
    node_id TEXT NOT NULL,
    minute_ms INTEGER NOT NULL,
    events INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    refused INTEGER NOT NULL,
    PRIMARY KEY (node_id, minute_ms)
);
"""
MINUTE_MS = 60_000
KEEP_MS = 7 * 24 * 3600 * 1000
EVENTS_PER_MIN = 6_000  # 100/s sustained: far past a storm the agent's suppression lets through
BYTES_PER_MIN = 8 * 1024 * 1024


@dataclass(slots=True)
class _Window:
    minute_ms: int
    events: int = 0
    bytes: int = 0
    refused: int = 0


class IngestQuota:
    """Per node and minute: events and bytes stored; ``charge`` says when a write is over."""

    def __init__(
        self,
        db: sqlite3.Connection,
        clock: Clock,
        events_per_min: int = EVENTS_PER_MIN,
        bytes_per_min: int = BYTES_PER_MIN,
    ) -> None:
        self._db = db
        self._clock = clock
        self.events_per_min = events_per_min
        self.bytes_per_min = bytes_per_min
        self._windows: dict[str, _Window] = {}
        db.executescript(_SCHEMA)

    def charge(self, node_id: str, events: int, size: int) -> str | None:
        """Count a write of ``events`` events, ``size`` bytes; the reason it is refused, or None."""
        minute = self._clock.time_ms() // MINUTE_MS * MINUTE_MS
        window = self._windows.get(node_id)
        if window is None or window.minute_ms != minute:
            window = self._windows[node_id] = _Window(minute)
        if window.events + events > self.events_per_min or window.bytes + size > self.bytes_per_min:
            window.refused += 1
            self._record(node_id, window)
            return (
                f"node {node_id} is over its write quota this minute ({window.events} events,"
                f" {window.bytes} bytes; max {self.events_per_min} events, {self.bytes_per_min} bytes"
                " a minute): resend after the backoff"
            )
        window.events += events
        window.bytes += size
        return None

    def _record(self, node_id: str, window: _Window) -> None:
        if window.refused == 1:  # the first refusal of a minute: the node is throttled, say so once
            log.warning("ingest_quota_exceeded", node=node_id, events=window.events, bytes=window.bytes)
        self._db.execute(
            """INSERT INTO ingest_quota(node_id, minute_ms, events, bytes, refused) VALUES (?, ?, ?, ?, ?)
               ON CONFLICT(node_id, minute_ms) DO UPDATE SET
                 events=excluded.events, bytes=excluded.bytes, refused=excluded.refused""",
            (node_id, window.minute_ms, window.events, window.bytes, window.refused),
        )
        if window.refused == 1:
            self._db.execute("DELETE FROM ingest_quota WHERE minute_ms < ?", (window.minute_ms - KEEP_MS,))

    def refused_minutes(self, node_id: str) -> list[tuple[int, int, int, int]]:
        """(minute_ms, events, bytes, refused) of each minute ``node_id`` was refused, oldest first."""
        rows = self._db.execute(
            "SELECT minute_ms, events, bytes, refused FROM ingest_quota WHERE node_id = ? ORDER BY minute_ms",
            (node_id,),
        ).fetchall()
        return [(int(a), int(b), int(c), int(d)) for a, b, c, d in rows]

    def forget(self, node_id: str) -> None:
        self._windows.pop(node_id, None)
