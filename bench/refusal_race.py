"""How often a refused stream reaches an agent-style client as the status the server sent.

The agent and the relay write their hello, then read. A server that ends the stream at once
races that write: when its status arrives while the write is still in flight, gRPC's Python
client fails the write and reports its own ``INTERNAL "Internal error from Core"`` in place
of the status sent, so the reconnect rule (``starpulse.core.grpc_client.after_failure``)
goes the wrong way. A server that reads the hello first (the controller, and the standby
since session 12) orders the two. A server that ends a live stream while the client writes
(mid-stream) cannot: there starpulse's ``send`` and ``read`` keep the status the call first
ended with and hand that back (``--raw`` counts what gRPC's own ``write`` and ``read`` give).
This counts what the client saw, per way of refusing, one new channel per attempt as the link
opens one per session.

    .venv/bin/python -m bench.refusal_race [--attempts 2000] [--raw]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
from typing import Any

import grpc

from bench.common import quiet_logging
from starpulse.core.grpc_client import read, send
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc


class Refusing(sgrpc.TelemetryServicer):
    """Ends every stream with UNKNOWN: at once, after reading the first message, or mid-stream
    (after the Welcome, while the client keeps writing: a controller ending a live stream)."""

    def __init__(self, how: str) -> None:
        self.how = how

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        if self.how != "at once":
            await context.read()
        if self.how == "mid-stream":
            await context.write(spb.ControllerMessage(welcome=spb.Welcome()))
            for _ in range(3):
                await context.read()
        await context.abort(grpc.StatusCode.UNKNOWN, "refused")


async def _raw_send(call: Any, message: Any) -> None:
    await call.write(message)


async def _raw_read(call: Any) -> Any:
    return await call.read()


async def _mid_stream(call: Any, write: Any, read_one: Any) -> None:
    """Hello, then reports written back to back (as the link does) until the stream ends."""
    await write(call, spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
    await read_one(call)
    report = spb.AgentMessage()
    report.report.seq = 1
    while True:
        await write(call, report)


async def attempts(how: str, n: int, raw: bool = False) -> collections.Counter[str]:
    """``raw``: gRPC's own ``write`` and ``read``; else starpulse's ``send`` and ``read``, which hand
    back the status the server sent where gRPC's client overwrote it with its own INTERNAL."""
    write, read_one = (_raw_send, _raw_read) if raw else (send, read)
    server = grpc.aio.server()
    sgrpc.add_TelemetryServicer_to_server(Refusing(how), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen: collections.Counter[str] = collections.Counter()
    try:
        for _ in range(n):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = sgrpc.TelemetryStub(channel).Connect()
                try:
                    if how == "mid-stream":
                        await _mid_stream(call, write, read_one)
                    await write(call, spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
                    await read_one(call)
                    seen["no error"] += 1
                except grpc.aio.AioRpcError as err:
                    seen[f"{err.code().name} {err.details()!r}"] += 1
                except asyncio.InvalidStateError:
                    seen["RPC already finished"] += 1
    finally:
        await server.stop(None)
    return seen


async def run(n: int, raw: bool) -> None:
    for how in ("at once", "after reading the hello", "mid-stream"):
        seen = await attempts(how, n, raw)
        print(f"refused {how}: " + ", ".join(f"{what}: {count}" for what, count in seen.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=2000, help="streams refused per way of refusing")
    parser.add_argument("--raw", action="store_true", help="gRPC's own write and read, not starpulse's send and read")
    args = parser.parse_args()
    quiet_logging()
    asyncio.run(run(args.attempts, args.raw))


if __name__ == "__main__":
    main()
