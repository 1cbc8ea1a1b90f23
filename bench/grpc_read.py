"""What one gRPC read of a relay's batch costs the controller, whatever the batch holds.

The controller reads each relay's stream one ``RelayUp`` at a time (``RelayServicer.Connect``).
A relay sends one every linger period (20 ms) however few reports it gathered, so this
fixed cost is paid per relay per period, not per report. Here a grpc.aio server reads
``RelayUp`` batches the way the controller does (every message's stream id and bytes
taken out) from a client in another process; the server's CPU time (every thread: the
event loop and gRPC's own) per read is the figure, for batches of 1 and 30 agent reports
of 6.6 kB (a delta report's mean size), sent back to back or 20 ms apart.

    .venv/bin/python -m bench.grpc_read [--reads 1000]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import Any

import grpc

from bench.common import median, quiet_logging, table, write_result
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

NAME = "grpc_read"
REPORT_BYTES = 6_600


class _Reader(sgrpc.RelayServicer):
    """Reads batches as RelayServicer.Connect does; times the reads after the first."""

    def __init__(self) -> None:
        self.reads = 0
        self.cpu_s = 0.0
        self.done = asyncio.Event()

    async def Connect(self, request_iterator: Any, context: grpc.aio.ServicerContext) -> None:
        await context.read()  # RelayHello
        await context.write(spb.RelayDown())
        started = time.process_time()
        while True:
            up = await context.read()
            if up is grpc.aio.EOF:
                break
            for item in up.batch.messages:
                _ = item.stream, item.message
            self.reads += 1
        self.cpu_s = time.process_time() - started
        self.done.set()


async def _serve_one(batch: int, gap_s: float, reads: int) -> float:
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 << 20)])
    reader = _Reader()
    sgrpc.add_RelayServicer_to_server(reader, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    client = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.grpc_read", "--client", str(port), str(batch), str(gap_s), str(reads)
    )
    try:
        await asyncio.wait_for(reader.done.wait(), timeout=reads * (gap_s + 0.05) + 60)
    finally:
        await client.wait()
        await server.stop(None)
    return reader.cpu_s / max(reader.reads, 1) * 1e6


async def _client(port: int, batch: int, gap_s: float, reads: int) -> None:
    options = [("grpc.max_send_message_length", 64 << 20)]
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as ch:
        call = sgrpc.RelayStub(ch).Connect()
        await call.write(spb.RelayUp(hello=spb.RelayHello(relay_id="bench", version="grpc_read")))
        await call.read()
        up = spb.RelayUp()
        for stream in range(1, batch + 1):
            up.batch.messages.add(stream=stream, message=os.urandom(REPORT_BYTES))
        for _ in range(reads):
            await call.write(up)
            await asyncio.sleep(gap_s)
        await call.done_writing()
        await call.code()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reads", type=int, default=1000, help="batches read per case")
    ap.add_argument("--rounds", type=int, default=3, help="runs per case (the median is printed)")
    ap.add_argument("--client", nargs=4, metavar=("PORT", "BATCH", "GAP_S", "READS"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.client:
        port, batch, gap, reads = args.client
        asyncio.run(_client(int(port), int(batch), float(gap), int(reads)))
        return {}
    quiet_logging()
    cases = [(1, 0.0), (30, 0.0), (1, 0.02), (30, 0.02)]
    figures: dict[str, Any] = {}
    rows: list[tuple[str, Any]] = []
    for batch, gap in cases:
        runs = [asyncio.run(_serve_one(batch, gap, args.reads)) for _ in range(args.rounds)]
        key = f"batch_{batch}_gap_{int(gap * 1000)}ms"
        figures[key] = {"us_per_read_median": round(median(runs), 1), "us_per_read_runs": [round(r, 1) for r in runs]}
        label = f"{batch:>2} reports of {REPORT_BYTES:,} B, {gap * 1000:g} ms apart: us per read"
        rows.append((label, round(median(runs))))
    rows.append(("load average (1/5/15 min) at the end", " ".join(f"{x:.2f}" for x in os.getloadavg())))
    print(table("server CPU per RelayUp read (grpc.aio, all threads; median of rounds)", rows))
    path = write_result(NAME, {"reads": args.reads, "rounds": args.rounds, "report_bytes": REPORT_BYTES}, figures)
    print(f"wrote {path}")
    return figures


if __name__ == "__main__":
    main()
