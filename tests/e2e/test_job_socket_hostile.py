"""Issue 32 item 2: a local process cannot poison the node's reports through the job socket.

Probes, as a process on the node would try them, written raw on the agent's real job socket
(JSON lines; Python's json accepts NaN and Infinity), with a real agent streaming to a real
controller on loopback:

- a job name past the controller's limit, one with a newline, an empty one, a number;
- a rank past the wire's uint32, a negative rank, a rank that is a string or a bool;
- a NaN, an Infinity, a negative and a string step time; a step past uint64;
- a checkpoint path of 5,000 characters, a line of 100,000; an unknown op; a line that is not JSON;
- registrations without end (the number kept per node is bounded);
- connections without end, held open (the number served at once is bounded; the ranks already
  connected keep working).

What must hold: the node keeps reporting (no report refused), the good ranks' progress
arrives whole, the bad field is dropped (not the rank), and nothing bad reaches the controller.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.factory import build_agent
from agent.jobs import JobGateway
from agent.runtime import Agent, AgentConfig
from agent.sim.node import SimNode
from controller.service import Controller, ControllerConfig
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.joblimits import MAX_JOB_NAME, UINT32_MAX, UINT64_MAX
from tests.helpers import free_port, wait_for

NODE = "node-000"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer."""
    with tempfile.TemporaryDirectory(prefix="sph-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}", http="127.0.0.1:0", db_path=tmp_path / "c.db", allowed_nodes=[NODE]
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    yield ctl
    await ctl.stop()


async def _send_lines(path: str, lines: list[str]) -> None:
    _reader, writer = await asyncio.open_unix_connection(path)
    for line in lines:
        writer.write(line.encode() + b"\n")
    await writer.drain()
    await asyncio.sleep(0.2)  # the agent reads them; then the client leaves (its ranks stay until stale)
    writer.close()
    await writer.wait_closed()


def _job_steps(ctl: Controller) -> dict[tuple[str, int], tuple[int, float]]:
    report = ctl.registry.nodes[NODE].latest_report
    assert report is not None
    return {(s.job, s.rank): (s.step, s.step_time_s) for s in report.job_steps}


async def test_hostile_job_lines_never_cost_the_node_its_reports(
    controller: Controller, tmp_path: Path, short_dir: Path
) -> None:
    sock = str(short_dir / "jobs.sock")
    agent: Agent = build_agent(
        AgentConfig(
            node_id=NODE,
            controllers=[f"127.0.0.1:{controller.grpc_port}"],
            interval_s=0.2,
            buffer_path=str(tmp_path / "buffer.db"),
            job_socket=sock,
        ),
        "sim",
        sim=SimNode(NODE, tmp_path / "hw", seed=0),
    )
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    try:
        await wait_for(lambda: agent.jobs is not None and Path(sock).exists(), what="the job socket")
        long_name = "j" * (MAX_JOB_NAME + 1)
        await _send_lines(
            sock,
            [
                json.dumps({"op": "register", "job": "train", "rank": 0, "world_size": 2}),
                json.dumps({"op": "register", "job": "train", "rank": 1, "world_size": 2}),
                json.dumps({"op": "register", "job": long_name, "rank": 0}),  # over the name limit
                json.dumps({"op": "register", "job": "bad\njob", "rank": 0}),  # a newline in the name
                json.dumps({"op": "register", "job": "", "rank": 0}),
                json.dumps({"op": "register", "job": 42, "rank": 0}),
                json.dumps({"op": "register", "job": "train", "rank": UINT32_MAX + 1}),  # past uint32
                json.dumps({"op": "register", "job": "train", "rank": -1}),
                json.dumps({"op": "register", "job": "train", "rank": "3"}),
                json.dumps({"op": "register", "job": "train", "rank": True}),
                json.dumps({"op": "register", "job": "train", "rank": 2, "world_size": 2**40}),  # field dropped
                '{"op": "step", "job": "train", "rank": 0, "step": 5, "step_time_s": NaN}',
                '{"op": "step", "job": "train", "rank": 1, "step": 6, "step_time_s": Infinity}',
                json.dumps({"op": "step", "job": "train", "rank": 1, "step": 7, "step_time_s": -1.0}),
                json.dumps({"op": "step", "job": "train", "rank": 1, "step": 8, "step_time_s": "fast"}),
                json.dumps({"op": "step", "job": "train", "rank": 2, "step": UINT64_MAX + 1, "step_time_s": 0.5}),
                json.dumps({"op": "checkpoint_done", "job": "train", "rank": 2, "step": 3, "path": "p" * 5000}),
                json.dumps({"op": "step", "job": "train", "rank": 2, "step": 1, "blob": "x" * 100_000}),  # > a line
                json.dumps({"op": "format_disk", "job": "train", "rank": 0}),
                "this is not json",
                json.dumps({"op": "step", "job": "train", "rank": 0, "step": 9, "step_time_s": 0.25}),
            ],
        )
        assert agent.jobs is not None
        await wait_for(
            lambda: (
                NODE in controller.registry.nodes
                and controller.registry.nodes[NODE].latest_report is not None
                and ("train", 0) in _job_steps(controller)
                and _job_steps(controller)[("train", 0)][0] == 9
            ),
            what="the good rank's progress at the controller",
        )
        seq = controller.registry.nodes[NODE].acked_report_seq
        await wait_for(lambda: controller.registry.nodes[NODE].acked_report_seq > seq + 2, what="reports keep coming")
        steps = _job_steps(controller)
        assert set(steps) == {("train", 0), ("train", 1), ("train", 2)}  # no bad name or rank got in
        assert steps[("train", 0)] == (9, 0.25)
        assert steps[("train", 1)] == (8, 0.0)  # the steps arrived; every bad step time was dropped
        assert steps[("train", 2)][0] == 0  # the step past uint64 was dropped, the 0.5 s kept
        assert steps[("train", 2)][1] == pytest.approx(0.5)
        ranks = {(r.job, r.rank): r for r in agent.jobs.ranks()}
        assert ranks[("train", 2)].world_size == 0 and ranks[("train", 2)].checkpoint_path == ""
        assert ranks[("train", 2)].last_checkpoint_step == 3
        assert controller.metrics.rejected.labels("invalid_message")._value.get() == 0
        assert agent.link.connects == 1  # the stream was never ended over it
    finally:
        stop.set()
        await task


async def test_registrations_per_node_are_bounded(short_dir: Path) -> None:
    """A local process registering rank after rank cannot grow the agent without end."""
    gateway = JobGateway(str(short_dir / "jobs.sock"), max_ranks=3)
    await gateway.start()
    try:
        await _send_lines(
            gateway.socket_path, [json.dumps({"op": "register", "job": "flood", "rank": r}) for r in range(10)]
        )
        assert [r.rank for r in gateway.ranks()] == [0, 1, 2]
        # The ones kept still take their progress.
        assert gateway.handle({"op": "step", "job": "flood", "rank": 1, "step": 4, "step_time_s": 1.0}) == ("flood", 1)
    finally:
        await gateway.close()


async def test_connections_at_once_are_bounded(short_dir: Path) -> None:
    gateway = JobGateway(str(short_dir / "jobs.sock"), max_connections=4)
    await gateway.start()
    held: list[asyncio.StreamWriter] = []
    try:
        for _ in range(4):
            _reader, writer = await asyncio.open_unix_connection(gateway.socket_path)
            held.append(writer)
        await wait_for(lambda: len(gateway._writers) == 4, what="four connections served")
        reader, extra = await asyncio.open_unix_connection(gateway.socket_path)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed at once
        extra.close()
        # A connection already held still registers.
        held[0].write(json.dumps({"op": "register", "job": "j", "rank": 0}).encode() + b"\n")
        await held[0].drain()
        await wait_for(lambda: [r.job for r in gateway.ranks()] == ["j"], what="the held connection's rank")
    finally:
        for writer in held:
            writer.close()
        await gateway.close()
