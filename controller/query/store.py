"""Every answer of the query surface from the controller's SQLite file alone.

What an HA standby serves: its copy of the tables follows the leader's through etcd, so
its answers trail the leader's by the watch delay. The topology is the one question it
cannot answer: only the leader reconciles LLDP against the declared fabric.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Iterable, Mapping
from typing import Any

from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident
from controller.fabric import Fabric
from controller.heal.acks import Ack, ack_of
from controller.heal.states import NodeHealState, lifecycle_records
from controller.heal.states import NodeRecord as LifecycleRecord
from controller.jobs.registry import JobRecord, JobRegistry
from controller.query.fleet import FleetReport, ReportSettings
from controller.query.history import report_with_history
from controller.query.nodes import NodeRow, node_statuses
from controller.query.surface import TopologyView
from controller.store import Store, StoredEventRow
from starpulse.core.clock import Clock
from starpulse.v1 import service_pb2 as spb


class StoreQueries:
    """``Queries`` answered from ``store``'s tables; ``fabric``: the declared fabric, when this side has it."""

    def __init__(self, store: Store, clock: Clock, fabric: Fabric | None = None) -> None:
        self.store = store
        self.clock = clock
        self._fabric = fabric
        self._incidents = IncidentStore(store.connection)

    # -- incidents ---------------------------------------------------------------------------

    def incidents(self, include_resolved: bool = False, limit: int = 100) -> list[Incident]:
        return self._incidents.list_incidents(active_only=not include_resolved, limit=limit)

    def open_incidents(self, limit: int = 100) -> list[Incident]:
        return self._incidents.list_incidents(active_only=True, limit=limit)

    def incident(self, incident_id: str) -> Incident | None:
        return self._incidents.get(incident_id)

    def incident_timeline(self, incident_id: str) -> list[dict[str, Any]]:
        return incident_timeline(self.store.connection, self._incidents.history(incident_id), incident_id)

    def incident_ack(self, incident_id: str) -> Ack | None:
        return ack_of(self.store.connection, incident_id)

    # -- fabric, jobs, nodes -----------------------------------------------------------------

    def topology(self) -> TopologyView | None:
        return None

    def fabric(self) -> Fabric | None:
        return self._fabric

    def jobs(self) -> list[JobRecord] | None:
        """The jobs as last persisted (step progress is written every ``persist_interval_ms``)."""
        return JobRegistry(self.store.connection, self.clock).jobs()

    def nodes(self) -> Iterable[NodeRow]:
        return self.store.load_nodes()

    def node_statuses(self, states: Collection[NodeHealState] = ()) -> list[spb.NodeStatus]:
        return node_statuses(self.nodes(), self.store, self.clock, states)

    def lifecycle(self) -> Mapping[str, LifecycleRecord]:
        return lifecycle_records(self.store.connection)

    def events(self, node_id: str | None, limit: int) -> list[StoredEventRow]:
        return self.store.list_events(node_id, limit)

    def fleet_report(self, window_s: float, settings: ReportSettings | None = None) -> FleetReport:
        now = self.clock.time_ms()
        return report_with_history(self.store.connection, now - int(window_s * 1000), now, settings)

    def fleet_series(self, window_s: float, buckets: int) -> list[FleetReport]:
        now = self.clock.time_ms()
        span = max(int(window_s * 1000) // max(buckets, 1), 1)
        start = now - span * buckets
        return [
            report_with_history(self.store.connection, start + i * span, start + (i + 1) * span) for i in range(buckets)
        ]


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # a controller without self-healing has no heal tables
        return []


def incident_timeline(
    conn: sqlite3.Connection, history: Iterable[Mapping[str, Any]], incident_id: str
) -> list[dict[str, Any]]:
    """What happened to an incident, oldest first: its own ``history``, the state changes of the
    nodes remediated for it, every scheduler and repair action, the repair evidence, the ack."""
    out: list[dict[str, Any]] = [
        {"at_ms": h["ts_ms"], "what": h["change"], "node": "", "by": h["detail"].get("by", ""),
         "detail": h["detail"].get("reason", "") or h["severity"]}
        for h in history
    ]  # fmt: skip
    for node, from_state, to_state, reason, actor, at_ms in _rows(
        conn,
        "SELECT node, from_state, to_state, reason, actor, at_ms FROM heal_transitions WHERE incident_id = ?",
        (incident_id,),
    ):
        out.append({"at_ms": at_ms, "what": f"{from_state} -> {to_state}", "node": node, "by": actor, "detail": reason})
    for node, kind, job, status, attempts, error, updated in _rows(
        conn,
        "SELECT node, kind, job, status, attempts, last_error, updated_ms FROM heal_pending_actions "
        "WHERE incident_id = ?",
        (incident_id,),
    ):
        detail = (
            f"{status} after {attempts} attempt(s)" + (f": {error}" if error else "") + (f" (job {job})" if job else "")
        )
        out.append({"at_ms": updated, "what": f"action {kind}", "node": node, "by": "starpulse", "detail": detail})
    for node, evidence in _rows(conn, "SELECT node, evidence FROM heal_repairs WHERE incident_id = ?", (incident_id,)):
        for e in json.loads(evidence):
            out.append({"at_ms": e["at_ms"], "what": f"repair {e['step']} {'ok' if e['ok'] else 'failed'}",
                        "node": node, "by": "starpulse", "detail": e["detail"]})  # fmt: skip
    ack = ack_of(conn, incident_id)
    if ack is not None:
        out.append({"at_ms": ack.at_ms, "what": "acked", "node": "", "by": ack.actor, "detail": ack.reason})
    return sorted(out, key=lambda e: e["at_ms"])
