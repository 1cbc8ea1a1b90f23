"""What a standby replica serves: reads from its replicated SQLite, and the way to the leader.

Agents' and relays' streams (Telemetry.Connect, Relay.Connect) and every Admin call are refused with
FAILED_PRECONDITION and trailing metadata ``starpulse-leader: HOST:PORT`` (empty while no
leader is elected); the agent's link follows that hint. Query reads (nodes, events,
incidents) are answered from the state the standby follows out of etcd, which trails the
leader by the watch delay; topology is computed only by the leader.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from aiohttp import web

from controller.detect.incidents import IncidentStore
from controller.outputs.query import (
    DEFAULT_EVENT_LIMIT,
    MAX_EVENT_LIMIT,
    incident_info,
    list_events_response,
    list_nodes_response,
)
from controller.store import Store
from starpulse.core.grpc_client import LEADER_METADATA_KEY
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

LeaderHint = Callable[[], str]


async def refuse(context: grpc.aio.ServicerContext, leader: str, what: str) -> NoReturn:
    """End the call with FAILED_PRECONDITION naming the leader (in the details and the trailing metadata)."""
    where = f"the leader is {leader}" if leader else "no leader is elected yet; retry shortly"
    await context.abort(
        grpc.StatusCode.FAILED_PRECONDITION,
        f"this controller is a standby and does not {what}; {where}",
        trailing_metadata=((LEADER_METADATA_KEY, leader),),
    )
    raise AssertionError("abort returned")  # pragma: no cover


class StandbyTelemetry(sgrpc.TelemetryServicer):
    def __init__(self, leader: LeaderHint) -> None:
        self.leader = leader

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await refuse(context, self.leader(), "accept agent streams")


class StandbyRelay(sgrpc.RelayServicer):
    def __init__(self, leader: LeaderHint) -> None:
        self.leader = leader

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await refuse(context, self.leader(), "accept relays")


def standby_admin(leader: LeaderHint) -> sgrpc.AdminServicer:
    """An Admin servicer whose every method refuses (operator writes go to the leader)."""

    def refusing(name: str) -> Callable[..., Any]:
        async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            await refuse(context, leader(), f"take admin calls ({name})")

        return method

    methods = {m.name: refusing(m.name) for m in spb.DESCRIPTOR.services_by_name["Admin"].methods}
    return type("StandbyAdmin", (sgrpc.AdminServicer,), methods)()


class StandbyQuery(sgrpc.QueryServicer):
    """Query reads straight from the replicated tables (no in-memory registry on a standby)."""

    def __init__(self, store: Store, leader: LeaderHint) -> None:
        self.store = store
        self.incidents = IncidentStore(store.connection)
        self.leader = leader

    async def ListNodes(
        self, request: spb.ListNodesRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListNodesResponse:
        return await list_nodes_response(self.store.load_nodes(), self.store, request, context)

    async def ListEvents(
        self, request: spb.ListEventsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListEventsResponse:
        return await list_events_response(self.store, request, context)

    async def ListIncidents(
        self, request: spb.ListIncidentsRequest, context: grpc.aio.ServicerContext
    ) -> spb.ListIncidentsResponse:
        limit = min(request.limit or DEFAULT_EVENT_LIMIT, MAX_EVENT_LIMIT)
        rows = self.incidents.list_incidents(active_only=not request.include_resolved, limit=limit)
        return spb.ListIncidentsResponse(incidents=[incident_info(i) for i in rows])

    async def GetTopology(
        self, request: spb.TopologyRequest, context: grpc.aio.ServicerContext
    ) -> spb.TopologyResponse:
        await refuse(context, self.leader(), "compute the topology")
        raise AssertionError("abort returned")  # pragma: no cover


def standby_http(leader: LeaderHint) -> web.Application:
    """/healthz on a standby: 200 (the process is fine) with its role and the leader's address."""

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "role": "standby", "leader": leader()})

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    return app
