"""A controller that only speaks the protocol: the floor of what gRPC (grpc.aio) costs per report.

Same server options, same generated servicer, same message decoding as the real
controller; every report is read and dropped (acked at most every 10 s, as the real one
does). ``bench.scale --null-controller`` runs the load against it, so the difference
to the real controller is what validation, the registry and detection cost.

    .venv/bin/python -m bench.null_controller PORT
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from typing import Any

import grpc

from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

EXTRA: list[tuple[str, int]] = [(k, int(v)) for k, v in (a.split("=") for a in sys.argv[2:])]


class NullTelemetry(sgrpc.TelemetryServicer):
    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        first = await context.read()
        if first is grpc.aio.EOF:
            return
        await context.write(spb.ControllerMessage(welcome=spb.Welcome(accepts_delta_reports=True)))
        acked_at = -math.inf
        while True:
            msg = await context.read()
            if msg is grpc.aio.EOF:
                return
            now = time.monotonic()
            if msg.WhichOneof("body") == "report" and now - acked_at >= 10.0:
                acked_at = now
                await context.write(spb.ControllerMessage(ack=spb.Ack(report_seq=msg.report.seq)))


async def main(port: int) -> None:
    server = grpc.aio.server(
        options=[
            ("grpc.max_receive_message_length", 4 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 60_000),
            ("grpc.keepalive_timeout_ms", 20_000),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.min_ping_interval_without_data_ms", 20_000),
            ("grpc.http2.max_ping_strikes", 0),
            *EXTRA,
        ]
    )
    sgrpc.add_TelemetryServicer_to_server(NullTelemetry(), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    await server.wait_for_termination()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1])))
