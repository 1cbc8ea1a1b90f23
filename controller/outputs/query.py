"""The gRPC Query service (what the CLI reads): nodes, events, incidents, topology.

It reads the query surface (``controller.query``), never detection's parts, so the same
servicer answers on the leader (``LiveQueries``) and on an HA standby (``StoreQueries``
over its replicated SQLite; ``controller.ha.standby``).
"""

from __future__ import annotations

import json

import grpc

from controller.detect.model import Incident
from controller.heal.states import parse_states
from controller.query.surface import Queries, TopologyView
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

DEFAULT_EVENT_LIMIT = 100
MAX_EVENT_LIMIT = 10_000


async def list_nodes_response(
    queries: Queries, request: spb.ListNodesRequest, context: grpc.aio.ServicerContext
) -> spb.ListNodesResponse:
    """ListNodes; an unknown lifecycle state in the filter is refused."""
    try:
        states = parse_states(request.lifecycle_states)
    except ValueError as err:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
    return spb.ListNodesResponse(nodes=queries.node_statuses(states))


async def list_events_response(
    queries: Queries, request: spb.ListEventsRequest, context: grpc.aio.ServicerContext
) -> spb.ListEventsResponse:
    """ListEvents from the store; an oversized limit is refused."""
    limit = request.limit or DEFAULT_EVENT_LIMIT
    if limit > MAX_EVENT_LIMIT:
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"limit must be ≤ {MAX_EVENT_LIMIT}")
    rows = queries.events(request.node_id or None, limit)
    return spb.ListEventsResponse(
        events=[spb.StoredEvent(node_id=r.node_id, event=r.event, received_ms=r.received_ms) for r in rows]
    )


def list_incidents_response(queries: Queries, request: spb.ListIncidentsRequest) -> spb.ListIncidentsResponse:
    limit = min(request.limit or DEFAULT_EVENT_LIMIT, MAX_EVENT_LIMIT)
    incidents = queries.incidents(include_resolved=request.include_resolved, limit=limit)
    return spb.ListIncidentsResponse(incidents=[incident_info(i) for i in incidents])


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
        evidence_json=json.dumps(incident.evidence, sort_keys=True, default=str),
        opened_ms=incident.opened_ms,
        resolved_ms=incident.resolved_ms or 0,
    )


def incident_detail(queries: Queries, incident: Incident, message: str = "") -> spb.IncidentDetail:
    """The incident, its timeline and who acknowledged it (``message``: what an admin call did)."""
    ack = queries.incident_ack(incident.id)
    return spb.IncidentDetail(
        incident=incident_info(incident),
        timeline_json=json.dumps(queries.incident_timeline(incident.id)),
        acked_by=ack.actor if ack is not None else "",
        acked_ms=ack.at_ms if ack is not None else 0,
        message=message,
    )


def topology_response(view: TopologyView) -> spb.TopologyResponse:
    report = view.report
    return spb.TopologyResponse(
        summary_json=json.dumps(
            {**view.summary, **({"probe_worst": list(view.probe_worst)} if view.probe_worst else {})}, sort_keys=True
        ),
        miswired=[m.message for m in report.miswired],
        unknown_devices=[f"{u.name} (seen by {u.seen_by} {u.local})".strip() for u in report.unknown],
        missing_links=[m.message for m in report.missing],
        nodes_reporting_lldp=view.nodes_reporting_lldp,
    )


class QueryServicer(sgrpc.QueryServicer):
    """The Query service over any ``Queries``: the leader's live one or a standby's store-backed one."""

    def __init__(self, queries: Queries) -> None:
        self.queries = queries

    async def ListIncidents(
        self, request: spb.ListIncidentsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListIncidentsResponse:
        return list_incidents_response(self.queries, request)

    async def GetTopology(
        self, request: spb.TopologyRequest, context: grpc.aio.ServicerContext
    ) -> spb.TopologyResponse:
        view = self.queries.topology()
        if view is None:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "this controller does not compute the topology")
        assert view is not None
        return topology_response(view)

    async def ListNodes(
        self, request: spb.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListNodesResponse:
        return await list_nodes_response(self.queries, request, context)

    async def ListEvents(
        self, request: spb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListEventsResponse:
        return await list_events_response(self.queries, request, context)

    async def GetIncident(self, request: spb.IncidentRequest, context: grpc.aio.ServicerContext) -> spb.IncidentDetail:
        incident = self.queries.incident(request.id.strip())
        if incident is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"no incident {request.id.strip()!r}")
        assert incident is not None
        return incident_detail(self.queries, incident)
