"""The fleet's own history of nodes in service: the denominator of every fault rate.

A rate "per 1,000 GPU-days" needs the GPU-days the fleet really had over the report's
window, not today's node count times its length: nodes join, are retired and come back.
``fleet_service`` keeps one row per interval a compute node belonged to the fleet, with its
GPU count, from its first registration until it is retired (an RMA); time in repair counts,
as it does in Meta's and Tencent's per-GPU-day figures (the fleet owned those GPUs).

The ledger is synced from the decision core's sweep (``sync``): cheap when nothing changed
(two counts compared), a set difference over the registry when something did.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Collection, Mapping
from dataclasses import dataclass

import structlog

from controller.store import transaction

log = structlog.get_logger(__name__)

_SCHEMA = """
CREATE TABLE IF NOT EXISTS fleet_service (
    node TEXT NOT NULL,
    gpus INTEGER NOT NULL,
    from_ms INTEGER NOT NULL,
    to_ms INTEGER,
    PRIMARY KEY (node, from_ms)
);
CREATE INDEX IF NOT EXISTS fleet_service_open ON fleet_service(to_ms);
"""


@dataclass(frozen=True, slots=True)
class ServiceInterval:
    """A node in the fleet from ``from_ms`` to ``to_ms`` (None: still in it)."""

    node: str
    gpus: int
    from_ms: int
    to_ms: int | None

    def overlap_ms(self, since_ms: int, until_ms: int) -> int:
        """Milliseconds of this interval inside [since_ms, until_ms)."""
        end = until_ms if self.to_ms is None else min(self.to_ms, until_ms)
        return max(0, end - max(self.from_ms, since_ms))


class FleetServiceLedger:
    """Reads and writes ``fleet_service`` on the controller's connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._db = conn
        self._db.executescript(_SCHEMA)
        self._seen: tuple[int, frozenset[str]] | None = None  # (nodes, retired) at the last full sync

    def open_nodes(self) -> dict[str, int]:
        """Nodes with an open interval, and their GPU counts."""
        return {n: g for n, g in self._db.execute("SELECT node, gpus FROM fleet_service WHERE to_ms IS NULL")}

    def sync(self, nodes: Mapping[str, tuple[int, int]], retired: Collection[str], now_ms: int) -> int:
        """Bring the open intervals in line with ``nodes`` (id -> (gpus, first_seen_ms)) less ``retired``.

        A node not yet in the ledger opens at its first sighting (so a restarted controller
        does not lose the time before the restart); a node seen again after retirement opens
        at ``now_ms``; a retired node's interval closes at ``now_ms``. Returns rows changed.
        """
        key = (len(nodes), frozenset(retired))
        if key == self._seen:
            return 0
        open_now = self.open_nodes()
        known = {n for (n,) in self._db.execute("SELECT DISTINCT node FROM fleet_service")}
        changed = 0
        with transaction(self._db):
            for node, (gpus, first_seen_ms) in nodes.items():
                if node in retired or node in open_now:
                    continue
                start = first_seen_ms if node not in known else now_ms
                self._db.execute(
                    "INSERT OR IGNORE INTO fleet_service(node, gpus, from_ms, to_ms) VALUES (?, ?, ?, NULL)",
                    (node, gpus, start),
                )
                changed += 1
            for node in open_now:
                if node in retired:
                    self._db.execute(
                        "UPDATE fleet_service SET to_ms = ? WHERE node = ? AND to_ms IS NULL", (now_ms, node)
                    )
                    changed += 1
        self._seen = key
        if changed:
            log.info("fleet_service_synced", changed=changed, in_service=len(nodes) - len(retired))
        return changed


def service_intervals(conn: sqlite3.Connection, since_ms: int, until_ms: int) -> list[ServiceInterval]:
    """Every interval overlapping [since_ms, until_ms); [] where the table does not exist yet."""
    try:
        rows = conn.execute(
            "SELECT node, gpus, from_ms, to_ms FROM fleet_service WHERE from_ms < ? AND (to_ms IS NULL OR to_ms > ?)",
            (until_ms, since_ms),
        ).fetchall()
    except sqlite3.OperationalError:
        return []
    return [ServiceInterval(*r) for r in rows]


def retired_nodes(conn: sqlite3.Connection) -> set[str]:
    """Nodes whose lifecycle row says retired (an RMA); none without self-healing's tables."""
    try:
        return {n for (n,) in conn.execute("SELECT node FROM heal_nodes WHERE state = 'retired'")}
    except sqlite3.OperationalError:
        return set()
