"""Read API for the CLI and other tools: nodes and events."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Collection, Iterable
from typing import Any, Protocol

import grpc

from controller.detect.model import Incident
from controller.detect.pipeline import Detection, evidence_json
from controller.heal.acks import ack_of
from controller.heal.states import NodeHealState, lifecycle_records, parse_states
from controller.ingest.registry import NodeRegistry
from controller.store import Store
from starpulse.core.clock import SYSTEM_CLOCK, Clock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc
from starpulse.v1 import telemetry_pb2 as tpb

RECENT_WINDOW_MS = 3600 * 1000
DEFAULT_EVENT_LIMIT = 100
MAX_EVENT_LIMIT = 10_000


class NodeRow(Protocol):
    """What a node status is made of: a live registry record or a row replicated from etcd."""

    @property
    def node_id(self) -> str: ...
    @property
    def role(self) -> int: ...
    @property
    def state(self) -> str: ...
    @property
    def last_seen_ms(self) -> int: ...
    @property
    def agent_version(self) -> str: ...
    @property
    def hostname(self) -> str: ...
    @property
    def inventory(self) -> ipb.Inventory: ...


def node_statuses(
    nodes: Iterable[NodeRow],
    store: Store,
    clock: Clock = SYSTEM_CLOCK,
    states: Collection[NodeHealState] = (),
) -> list[spb.NodeStatus]:
    """One row per node, by id; open_events = warning-or-worse events in the last hour (on ``clock``).

    ``state`` is presence (online/unreachable); ``lifecycle_state`` is where the node is in
    remediation, read from the same SQLite file (a node without a row is in service).
    ``states`` keeps only nodes in those lifecycle states.
    """
    recent = store.recent_event_counts(clock.time_ms() - RECENT_WINDOW_MS, tpb.SEVERITY_WARNING)
    lifecycle = lifecycle_records(store.connection)
    out = []
    for node in sorted(nodes, key=lambda n: n.node_id):
        rec = lifecycle.get(node.node_id)
        life = rec.state if rec is not None else NodeHealState.IN_SERVICE
        if states and life not in states:
            continue
        out.append(
            spb.NodeStatus(
                node_id=node.node_id,
                role=ipb.NodeRole.Name(node.role),
                state=node.state,
                last_seen_ms=node.last_seen_ms,
                gpu_count=len(node.inventory.gpus),
                nic_count=len(node.inventory.nics),
                open_events=recent.get(node.node_id, 0),
                agent_version=node.agent_version,
                hostname=node.hostname,
                accelerator_vendor=accelerator_vendor(node.inventory),
                accelerator_model=node.inventory.gpus[0].model if node.inventory.gpus else "",
                lifecycle_state=str(life),
                lifecycle_since_ms=rec.since_ms if rec is not None else 0,
                lifecycle_reason=rec.reason if rec is not None else "",
                drained_by=(rec.drained_by or "") if rec is not None else "",
                incident_id=(rec.incident_id or "") if rec is not None else "",
            )
        )
    return out


async def list_nodes_response(
    nodes: Iterable[NodeRow],
    store: Store,
    request: spb.ListNodesRequest,
    context: grpc.aio.ServicerContext,
    clock: Clock = SYSTEM_CLOCK,
) -> spb.ListNodesResponse:
    """ListNodes (leader and standby alike); an unknown lifecycle state in the filter is refused."""
    try:
        states = parse_states(request.lifecycle_states)
    except ValueError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    return spb.ListNodesResponse(nodes=node_statuses(nodes, store, clock, states))


def accelerator_vendor(inventory: ipb.Inventory) -> str:
    """The vendors of a node's accelerators, in inventory order; a GPU without one is NVIDIA (older agents)."""
    return ",".join(dict.fromkeys(g.vendor or "nvidia" for g in inventory.gpus))


async def list_events_response(
    store: Store, request: spb.ListEventsRequest, context: grpc.aio.ServicerContext
) -> spb.ListEventsResponse:
    """ListEvents from the store (leader and standby alike); an oversized limit is refused."""
    limit = request.limit or DEFAULT_EVENT_LIMIT
    if limit > MAX_EVENT_LIMIT:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be ≤ {MAX_EVENT_LIMIT}")
    rows = store.list_events(request.node_id or None, limit)
    return spb.ListEventsResponse(
        events=[spb.StoredEvent(node_id=r.node_id, event=r.event, received_ms=r.received_ms) for r in rows]
    )


def incident_info(incident: Incident) -> spb.IncidentInfo:
    return spb.IncidentInfo(
        id=incident.id,
        kind=incident.kind,
        root_cause=incident.root_cause,
        component_type=incident.component_type,
        affected_nodes=incident.affected_nodes,
        affected_jobs=incident.affected_jobs,
        severity=incident.severity,
        action=incident.action,
        evidence_json=evidence_json(incident),
        opened_ms=incident.opened_ms,
        resolved_ms=incident.resolved_ms or 0,
    )


def _rows(conn: sqlite3.Connection, sql: str, args: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    try:
        return conn.execute(sql, args).fetchall()
    except sqlite3.OperationalError:  # a controller without self-healing has no heal tables
        return []


def incident_timeline(conn: sqlite3.Connection, detection: Detection, incident: Incident) -> list[dict[str, Any]]:
    """What happened to an incident, oldest first: its own history, the state changes of the
    nodes remediated for it, every scheduler and repair action, the repair evidence, the ack."""
    out: list[dict[str, Any]] = [
        {"at_ms": h["ts_ms"], "what": h["change"], "node": "", "by": h["detail"].get("by", ""),
         "detail": h["detail"].get("reason", "") or h["severity"]}
        for h in detection.incidents.history(incident.id)
    ]  # fmt: skip
    for node, from_state, to_state, reason, actor, at_ms in _rows(
        conn,
        "SELECT node, from_state, to_state, reason, actor, at_ms FROM heal_transitions WHERE incident_id = ?",
        (incident.id,),
    ):
        out.append({"at_ms": at_ms, "what": f"{from_state} -> {to_state}", "node": node, "by": actor, "detail": reason})
    for node, kind, job, status, attempts, error, updated in _rows(
        conn,
        "SELECT node, kind, job, status, attempts, last_error, updated_ms FROM heal_pending_actions "
        "WHERE incident_id = ?",
        (incident.id,),
    ):
        detail = (
            f"{status} after {attempts} attempt(s)" + (f": {error}" if error else "") + (f" (job {job})" if job else "")
        )
        out.append({"at_ms": updated, "what": f"action {kind}", "node": node, "by": "starpulse", "detail": detail})
    for node, evidence in _rows(conn, "SELECT node, evidence FROM heal_repairs WHERE incident_id = ?", (incident.id,)):
        for e in json.loads(evidence):
            out.append({"at_ms": e["at_ms"], "what": f"repair {e['step']} {'ok' if e['ok'] else 'failed'}",
                        "node": node, "by": "starpulse", "detail": e["detail"]})  # fmt: skip
    ack = ack_of(conn, incident.id)
    if ack is not None:
        out.append({"at_ms": ack.at_ms, "what": "acked", "node": "", "by": ack.actor, "detail": ack.reason})
    return sorted(out, key=lambda e: e["at_ms"])


def incident_detail(
    conn: sqlite3.Connection, detection: Detection, incident: Incident, message: str = ""
) -> spb.IncidentDetail:
    ack = ack_of(conn, incident.id)
    return spb.IncidentDetail(
        incident=incident_info(incident),
        timeline_json=json.dumps(incident_timeline(conn, detection, incident)),
        acked_by=ack.actor if ack is not None else "",
        acked_ms=ack.at_ms if ack is not None else 0,
        message=message,
    )


def topology_response(detection: Detection) -> spb.TopologyResponse:
    fabric = detection.fabric
    report = detection.topology.report
    return spb.TopologyResponse(
        summary_json=json.dumps(fabric.summary() if fabric is not None else {}, sort_keys=True),
        miswired=[m.message for m in report.miswired],
        unknown_devices=[f"{u.name} (seen by {u.seen_by} {u.local})".strip() for u in report.unknown],
        missing_links=[m.message for m in report.missing],
        nodes_reporting_lldp=detection.topology.nodes_reporting,
    )


class QueryServicer(sgrpc.QueryServicer):
    def __init__(self, registry: NodeRegistry, store: Store, detection: Detection) -> None:
        self.registry = registry
        self.store = store
        self.detection = detection

    async def ListIncidents(
        self, request: spb.ListIncidentsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListIncidentsResponse:
        limit = min(request.limit or DEFAULT_EVENT_LIMIT, MAX_EVENT_LIMIT)
        incidents = self.detection.incidents.list_incidents(active_only=not request.include_resolved, limit=limit)
        return spb.ListIncidentsResponse(incidents=[incident_info(i) for i in incidents])

    async def GetTopology(
        self, request: spb.TopologyRequest, context: grpc.aio.ServicerContext
    ) -> spb.TopologyResponse:
        return topology_response(self.detection)

    async def ListNodes(
        self, request: spb.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListNodesResponse:
        return await list_nodes_response(
            self.registry.nodes.values(), self.store, request, context, self.registry.clock
        )

    async def ListEvents(
        self, request: spb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListEventsResponse:
        return await list_events_response(self.store, request, context)

    async def GetIncident(self, request: spb.IncidentRequest, context: grpc.aio.ServicerContext) -> spb.IncidentDetail:
        incident = self.detection.correlator.get(request.id.strip())
        if incident is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no incident {request.id.strip()!r}")
        assert incident is not None
        return incident_detail(self.store.connection, self.detection, incident)
