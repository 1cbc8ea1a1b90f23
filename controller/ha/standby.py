"""What a standby replica serves: reads from its replicated SQLite, and the way to the leader.

Agents' and relays' streams (Telemetry.Connect, Relay.Connect) and every Admin call are refused with
FAILED_PRECONDITION and trailing metadata ``starpulse-leader: HOST:PORT`` (empty while no
leader is elected); the agent's link follows that hint. Query reads (nodes, events,
incidents and their timelines) are answered by the same Query servicer as the leader's, over
the store-backed query surface (``controller.query.store``): the state the standby follows out
of etcd, which trails the leader by the watch delay. The topology is computed only by the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any, NoReturn

import grpc
from aiohttp import web

from controller.outputs.query import QueryServicer
from controller.query.store import StoreQueries
from controller.store import Store
from starpulse.core.clock import Clock
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


# How long a refused stream's first message is waited for (see ``refuse_stream``).
FIRST_MESSAGE_WAIT_S = 10.0


async def refuse_stream(context: grpc.aio.ServicerContext, leader: LeaderHint, what: str) -> NoReturn:
    """Refuse a client stream once its first message (Hello, RelayHello) has arrived.

    Both clients write their hello and then read. Refusing before that write has completed
    races it: when the status reaches the client while its write is still in flight, gRPC's
    Python client fails the write and reports its own ``INTERNAL "Internal error from Core"``
    in place of our FAILED_PRECONDITION, the leader hint is lost and the reconnect rule keeps
    the client on this standby. Reading the first message orders the two: the hello write is
    done before the refusal is sent. A client that sends nothing is refused after
    ``FIRST_MESSAGE_WAIT_S`` all the same.
    """
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(context.read(), FIRST_MESSAGE_WAIT_S)
    await refuse(context, leader(), what)  # the leader as known now, after the wait


class StandbyTelemetry(sgrpc.TelemetryServicer):
    def __init__(self, leader: LeaderHint) -> None:
        self.leader = leader

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await refuse_stream(context, self.leader, "accept agent streams")


class StandbyRelay(sgrpc.RelayServicer):
    def __init__(self, leader: LeaderHint) -> None:
        self.leader = leader

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await refuse_stream(context, self.leader, "accept relays")


def standby_admin(leader: LeaderHint) -> sgrpc.AdminServicer:
    """An Admin servicer whose every method refuses (operator writes go to the leader)."""

    def refusing(name: str) -> Callable[..., Any]:
        async def method(self: Any, request: Any, context: grpc.aio.ServicerContext) -> Any:
            await refuse(context, leader(), f"take admin calls ({name})")

        return method

    methods = {m.name: refusing(m.name) for m in spb.DESCRIPTOR.services_by_name["Admin"].methods}
    return type("StandbyAdmin", (sgrpc.AdminServicer,), methods)()


class StandbyQuery(QueryServicer):
    """Query reads straight from the replicated tables (no in-memory registry on a standby)."""

    def __init__(self, store: Store, leader: LeaderHint, clock: Clock) -> None:
        """``clock``: what "the last hour" of a node's events is counted back from."""
        super().__init__(StoreQueries(store, clock))
        self.leader = leader

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
