"""Stream takeover (issue 32): how long until the real agent is back and reporting after an imposter's Hello.

    .venv/bin/python -m bench.takeover [--runs 10] [--interval 5] [--backoff 0.5]

A real controller on loopback and one real agent on a simulated node (`--interval` s between
reports, the shipped reconnect backoff: first wait 0.25-0.5 s, jittered). Each run, once the
agent reports, a raw gRPC client says Hello as the agent's node and keeps its stream open
(the imposter wins: the newest stream always does). Measured from the imposter's Welcome:

- *told*: the agent's stream ended with ABORTED (it knows it was replaced);
- *back*: the agent's new stream was welcomed (it displaced the imposter in turn);
- *reporting*: the controller recorded a report sent on the agent's new stream.

Goal: *reporting* within one report interval plus the reconnect backoff. The imposter's
stream is closed after each run; from the second takeover on the node has an open
``agent_conflict`` incident, as it should (two live claimants).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import grpc

from agent.factory import build_agent
from agent.runtime import AgentConfig
from agent.sim.node import SimNode
from agent.transport.link import STABLE_STREAM_S
from bench.common import free_port, median, quiet_logging, table, write_result
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import service_pb2_grpc as sgrpc

NODE = "node-000"


async def _until(cond: Callable[[], bool], timeout: float = 60.0) -> float:  # noqa: ASYNC109
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit("bench.takeover: timed out")
        await asyncio.sleep(0.005)
    return time.monotonic()


async def run(runs: int, interval_s: float, backoff_s: float) -> dict[str, list[float]]:
    work = Path(tempfile.mkdtemp(prefix="takeover-"))
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=work / "c.db",
            allowed_nodes=[NODE],
            report_interval_s=interval_s,
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    sim = SimNode(NODE, work / "hw", seed=0)
    agent = build_agent(
        AgentConfig(
            node_id=NODE,
            controllers=[f"127.0.0.1:{ctl.grpc_port}"],
            interval_s=interval_s,
            buffer_path=str(work / "buffer.db"),
        ),
        "sim",
        sim=sim,
    )
    agent.link.backoff.initial_s = backoff_s
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    link = agent.link
    told: list[float] = []
    back: list[float] = []
    reporting: list[float] = []
    try:
        await _until(lambda: NODE in ctl.registry.nodes and ctl.registry.nodes[NODE].latest_report is not None)
        node = ctl.registry.nodes[NODE]
        for _ in range(runs):
            # The agent's stream settled: displaced after STABLE_STREAM_S, its backoff starts over.
            await asyncio.sleep(max(interval_s * 1.5, STABLE_STREAM_S + 1))
            replaced, connects = link.replaced, link.connects
            async with grpc.aio.insecure_channel(f"127.0.0.1:{ctl.grpc_port}") as channel:
                call = sgrpc.TelemetryStub(channel).Connect()
                hello = spb.Hello(node_id=NODE, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="imposter", next_event_seq=1)
                await call.write(spb.AgentMessage(hello=hello))
                await call.read()  # the imposter's Welcome: it holds the node now
                t0 = time.monotonic()
                told.append(await _until(lambda r=replaced: link.replaced > r) - t0)  # type: ignore[misc]
                back.append(await _until(lambda c=connects: link.connects > c) - t0)  # type: ignore[misc]
                # A report recorded after the agent was back: its old stream had ended (ABORTED)
                # before, so a higher seq came on the new stream.
                seq_back = node.acked_report_seq
                reporting.append(await _until(lambda s=seq_back: node.acked_report_seq > s) - t0)  # type: ignore[misc]
                call.cancel()
    finally:
        stop.set()
        await task
        await ctl.stop()
    return {"told": told, "back": back, "reporting": reporting}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--interval", type=float, default=5.0, help="the agent's report interval, s")
    parser.add_argument("--backoff", type=float, default=0.5, help="the reconnect backoff's first ceiling, s")
    args = parser.parse_args()
    quiet_logging()
    result = asyncio.run(run(args.runs, args.interval, args.backoff))
    figures = {
        f"{k}_{stat}_s": round(f(v), 3) for k, v in result.items() for stat, f in (("median", median), ("max", max))
    }
    print(table(f"takeover: {args.runs} runs, report interval {args.interval:g} s", list(figures.items())))
    write_result("takeover", vars(args), figures)


if __name__ == "__main__":
    main()
