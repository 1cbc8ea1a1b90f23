"""Every durable controller row mirrored into etcd, written only by the current leader.

Why rows and not a new store: all the state healing needs (nodes, incidents, remediation
states and planned actions, breaker, approvals, outbox, job registry, events) already
lives in SQLite tables on one connection, each module owning its schema. Mirroring at the
row level keeps those modules unchanged, and a table added later is replicated without
anyone remembering to.

How: triggers on every table append (table, rowid) to ``ha_changes`` in the same SQLite
transaction as the change. ``flush()`` turns the pending changes into puts (the row as
JSON, key ``prefix/cluster/rows/<table>/<rowid>``) and deletes, sent as etcd transactions
that each carry the leader's fencing compare: a deposed leader's flush is refused whole.
``restore()`` rebuilds the local tables from etcd at one revision (what a new leader does
before it builds its controller); ``follow()`` applies the watch stream (what a standby
does to answer reads).

Events are history, not state: their keys are attached to an hourly lease that expires
``event_retention_s`` later, and a restore merges them instead of replacing the table.
Presence-only updates of ``nodes`` (last_seen_ms) are not mirrored: a new leader gives
every node a fresh heartbeat timeout anyway.
"""

from __future__ import annotations

import asyncio
import base64
import json
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import aetcd
import aetcd.utils
import structlog

from controller.ha.config import HAConfig
from controller.ha.election import Elector, NotLeader
from controller.ha.etcd import scan_prefix
from controller.store import transaction

log = structlog.get_logger(__name__)

TXN_OPS = 120  # etcd refuses a transaction of more than --max-txn-ops (128 by default)
NOT_MIRRORED = frozenset({"schema_version", "ha_changes", "node_last_seen"})  # presence churn stays local
EXPIRING = frozenset({"events"})  # history: merged on restore, expires in etcd after the retention
# Updates of these tables are mirrored only when this condition holds (no churn from presence sweeps).
UPDATE_WHEN = {
    "nodes": " OR ".join(
        f"OLD.{c} IS NOT NEW.{c}"
        for c in ("role", "state", "agent_version", "hostname", "inventory", "buffer_epoch", "acked_event_seq")
    ),
}

_CHANGES = """
CREATE TABLE IF NOT EXISTS ha_changes (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    tbl TEXT NOT NULL,
    rid INTEGER NOT NULL
);
"""


def encode_row(columns: list[str], values: tuple[Any, ...]) -> bytes:
    """One row as JSON; BLOBs as {"$b": base64}."""
    out = {
        c: ({"$b": base64.b64encode(v).decode()} if isinstance(v, bytes) else v)
        for c, v in zip(columns, values, strict=True)
    }
    return json.dumps(out, separators=(",", ":")).encode()


def decode_row(raw: bytes) -> dict[str, Any]:
    row = json.loads(raw)
    return {c: (base64.b64decode(v["$b"]) if isinstance(v, dict) and "$b" in v else v) for c, v in row.items()}


class StateMirror:
    """Mirrors one SQLite connection's tables into etcd (leader) or from it (standby)."""

    def __init__(
        self,
        conn: sqlite3.Connection,
        client: aetcd.Client,
        config: HAConfig,
        elector: Elector | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.conn = conn
        self.client = client
        self.config = config
        self.elector = elector
        self._clock = clock
        self._prefix = config.key("rows") + b"/"
        self._lock = asyncio.Lock()
        self._columns: dict[str, list[str]] = {}
        self._events_lease: tuple[int, Any] | None = None  # (hour bucket, lease)
        self.flushed_rows = 0
        self.install()

    # -- triggers --------------------------------------------------------------------------
    def tables(self) -> list[str]:
        rows = self.conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' ORDER BY name"
        )
        return [r[0] for r in rows if r[0] not in NOT_MIRRORED]

    def install(self) -> None:
        """Create ha_changes and the triggers (idempotent; call after every module made its tables)."""
        # A REPLACE deletes the old row; without this its delete trigger would not fire.
        self.conn.execute("PRAGMA recursive_triggers = ON")
        self.conn.executescript(_CHANGES)
        for table in self.tables():
            self._columns[table] = [r[1] for r in self.conn.execute(f'PRAGMA table_info("{table}")')]
            when = f" WHEN {UPDATE_WHEN[table]}" if table in UPDATE_WHEN else ""
            self.conn.executescript(
                f"""
                CREATE TRIGGER IF NOT EXISTS "ha_{table}_ins" AFTER INSERT ON "{table}"
                BEGIN INSERT INTO ha_changes(tbl, rid) VALUES ('{table}', NEW.rowid); END;
                CREATE TRIGGER IF NOT EXISTS "ha_{table}_upd" AFTER UPDATE ON "{table}"{when}
                BEGIN INSERT INTO ha_changes(tbl, rid) VALUES ('{table}', NEW.rowid); END;
                CREATE TRIGGER IF NOT EXISTS "ha_{table}_del" AFTER DELETE ON "{table}"
                BEGIN INSERT INTO ha_changes(tbl, rid) VALUES ('{table}', OLD.rowid); END;
                """
            )

    def pending(self) -> int:
        (n,) = self.conn.execute("SELECT COUNT(*) FROM ha_changes").fetchone()
        return int(n)

    def _key(self, table: str, rid: int) -> bytes:
        return self._prefix + f"{table}/{rid:016d}".encode()

    def _parse_key(self, key: bytes) -> tuple[str, int] | None:
        table, _, rid = key[len(self._prefix) :].decode().partition("/")
        if table not in self._columns or not rid.isdigit():
            log.warning("ha_mirror_unknown_key", key=key.decode(errors="replace"))
            return None
        return table, int(rid)

    # -- leader: push ------------------------------------------------------------------------
    async def flush(self) -> int:
        """Send every pending change to etcd under the fencing compare; returns rows sent.

        Raises NotLeader when etcd refuses (someone else leads now); the changes stay
        pending locally, and this replica must stop acting.
        """
        if self.elector is None:
            raise NotLeader("a standby's mirror does not write")
        async with self._lock:
            changes = self.conn.execute("SELECT seq, tbl, rid FROM ha_changes ORDER BY seq").fetchall()
            if not changes:
                return 0
            last: dict[tuple[str, int], int] = {}
            for seq, table, rid in changes:
                last[(table, rid)] = seq
            ops = []
            t = self.client.transactions
            for (table, rid), _seq in sorted(last.items(), key=lambda kv: kv[1]):
                key = self._key(table, rid)
                cursor = self.conn.execute(f'SELECT * FROM "{table}" WHERE rowid = ?', (rid,))
                row = cursor.fetchone()
                if row is None:
                    ops.append(t.delete(key))
                    continue
                columns = [d[0] for d in cursor.description]
                lease = await self._lease_for(table)
                ops.append(t.put(key, encode_row(columns, row), lease=lease))
            for i in range(0, len(ops), TXN_OPS):
                await self._fenced(ops[i : i + TXN_OPS])
            self.conn.execute("DELETE FROM ha_changes WHERE seq <= ?", (changes[-1][0],))
            self.flushed_rows += len(ops)
            return len(ops)

    async def check(self) -> None:
        """Flush, and when there was nothing to flush, still prove the lease in etcd (an empty fenced txn)."""
        if await self.flush() == 0:
            await self._fenced([])

    async def _fenced(self, ops: list[Any]) -> None:
        assert self.elector is not None
        ok, _ = await self.client.transaction(compare=[self.elector.fence_compare()], success=ops, failure=[])
        if not ok:
            self.elector.refused()
            raise NotLeader("etcd refused a fenced write: another replica leads")

    async def _lease_for(self, table: str) -> Any:
        if table not in EXPIRING or self.config.event_retention_s <= 0:
            return None
        bucket = int(self._clock() // 3600)
        if self._events_lease is None or self._events_lease[0] != bucket:
            lease = await self.client.lease(int(self.config.event_retention_s) + 3600)
            self._events_lease = (bucket, lease)
        return self._events_lease[1]

    # -- new leader / standby: pull ------------------------------------------------------------
    async def restore(self) -> int:
        """Make the local tables what etcd holds (events merged); returns the etcd revision read."""
        rows: list[tuple[str, int, dict[str, Any]]] = []
        revision = 0
        async for revision, kvs in scan_prefix(self.client, self._prefix):  # noqa: B007
            for kv in kvs:
                parsed = self._parse_key(kv.key)
                if parsed is not None:
                    rows.append((*parsed, decode_row(kv.value)))
        with transaction(self.conn):
            for table in self._columns:
                if table not in EXPIRING:
                    self.conn.execute(f'DELETE FROM "{table}"')
            for table, rid, row in rows:
                self._upsert(table, rid, row)
            self.conn.execute("DELETE FROM ha_changes")
        log.info("ha_state_restored", rows=len(rows), revision=revision)
        return revision

    def _upsert(self, table: str, rid: int, row: dict[str, Any]) -> None:
        cols = [c for c in row if c in self._columns[table]]
        names = ", ".join(["rowid", *(f'"{c}"' for c in cols)])
        marks = ", ".join("?" * (len(cols) + 1))
        self.conn.execute(f'INSERT OR REPLACE INTO "{table}"({names}) VALUES ({marks})', [rid, *(row[c] for c in cols)])

    def apply(self, kind: str, key: bytes, value: bytes) -> None:
        """One watch event (PUT or DELETE) applied to the local tables."""
        parsed = self._parse_key(key)
        if parsed is None:
            return
        table, rid = parsed
        with transaction(self.conn):
            if kind == "PUT":
                self._upsert(table, rid, decode_row(value))
            else:
                self.conn.execute(f'DELETE FROM "{table}" WHERE rowid = ?', (rid,))
            self.conn.execute("DELETE FROM ha_changes")

    async def follow(self) -> None:
        """Standby: restore, then apply the watch stream; start over after any etcd trouble. Runs until cancelled."""
        while True:
            try:
                revision = await self.restore()
                watch = await self.client.watch(
                    self._prefix, range_end=aetcd.utils.prefix_range_end(self._prefix), start_revision=revision + 1
                )
                try:
                    async for event in watch:
                        self.apply(str(event.kind), event.kv.key, event.kv.value)
                finally:
                    await watch.cancel()
            except (aetcd.exceptions.ClientError, OSError) as exc:
                log.warning("ha_follow_restart", detail=str(exc) or type(exc).__name__)
                await asyncio.sleep(1.0)
