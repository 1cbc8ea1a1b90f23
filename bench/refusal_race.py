"""How often a refused stream reaches an agent-style client as the status the server sent.

The agent and the relay write their hello, then read. A server that ends the stream at once
races that write: when its status arrives while the write is still in flight, gRPC's Python
client fails the write and reports its own ``INTERNAL "Internal error from Core"`` in place
of the status sent, so the reconnect rule (``starpulse.core.grpc_client.after_failure``)
goes the wrong way. A server that reads the hello first (the controller, and the standby
since session 12) orders the two. This counts what the client saw, per way of refusing, one
new channel per attempt as the link opens one per session.

    .venv/bin/python -m bench.refusal_race [--attempts 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import collections
from typing import Any

import grpc

from bench.common import quiet_logging
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc


class Refusing(sgrpc.TelemetryServicer):
    """Ends every stream with UNKNOWN, at once or after reading the first message."""

    def __init__(self, read_first: bool) -> None:
        self.read_first = read_first

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        if self.read_first:
            await context.read()
        await context.abort(grpc.StatusCode.UNKNOWN, "refused")


async def attempts(read_first: bool, n: int) -> collections.Counter[str]:
    server = grpc.aio.server()
    sgrpc.add_TelemetryServicer_to_server(Refusing(read_first), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    seen: collections.Counter[str] = collections.Counter()
    try:
        for _ in range(n):
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = sgrpc.TelemetryStub(channel).Connect()
                try:
                    await call.write(spb.AgentMessage(hello=spb.Hello(node_id="node-000")))
                    await call.read()
                    seen["no error"] += 1
                except grpc.aio.AioRpcError as err:
                    seen[f"{err.code().name} {err.details()!r}"] += 1
    finally:
        await server.stop(None)
    return seen


async def run(n: int) -> None:
    for read_first in (False, True):
        seen = await attempts(read_first, n)
        how = "after reading the hello" if read_first else "at once"
        print(f"refused {how}: " + ", ".join(f"{what}: {count}" for what, count in seen.most_common()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--attempts", type=int, default=2000, help="streams refused per way of refusing")
    args = parser.parse_args()
    quiet_logging()
    asyncio.run(run(args.attempts))


if __name__ == "__main__":
    main()
