"""The agent's job gateway on a real unix socket, its collector, and checkpoint requests
delivered to a real training process (examples/train.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import stat
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.jobs import JobCollector, JobGateway
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.job import StarpulseJob
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import wait_for

TRAIN = Path(__file__).resolve().parents[2] / "examples" / "train.py"


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer."""
    with tempfile.TemporaryDirectory(prefix="spg-", dir="/tmp") as d:
        yield Path(d)


@pytest.fixture
async def gateway(short_dir: Path) -> AsyncIterator[JobGateway]:
    gw = JobGateway(str(short_dir / "run" / "jobs.sock"))
    await gw.start()
    try:
        yield gw
    finally:
        await gw.close()


def job_for(gw: JobGateway, rank: int, ckpt: Path) -> StarpulseJob:
    return StarpulseJob(
        "llm", rank=rank, world_size=2, checkpoint_dir=ckpt, socket_path=gw.socket_path, signal_number=None
    )


async def test_socket_created_with_mode_and_folder(gateway: JobGateway) -> None:
    st = os.stat(gateway.socket_path)
    assert stat.S_ISSOCK(st.st_mode)
    assert stat.S_IMODE(st.st_mode) == 0o660


async def test_two_ranks_register_report_and_fill_the_report(gateway: JobGateway, short_dir: Path) -> None:
    r0, r1 = job_for(gateway, 0, short_dir / "ck"), job_for(gateway, 1, short_dir / "ck")
    try:
        assert r0.register() and r1.register()
        for step in range(1, 4):
            r0.step(step, 0.5)
            r1.step(step, 0.5 + step)  # rank 1 gets slower
        r0.save_checkpoint(3, b"a")
        await wait_for(
            lambda: len(gateway.ranks()) == 2 and all(r.step == 3 for r in gateway.ranks()),
            timeout=5,
            what="two ranks at step 3",
        )
        await wait_for(lambda: gateway.ranks()[0].last_checkpoint_step == 3, timeout=5, what="checkpoint_done")
        report = tpb.Report()
        collector = JobCollector(gateway)
        assert collector.name == "jobs" and collector.supported()
        assert collector.collect(report) == []
        samples = {(s.job, s.rank): s for s in report.job_steps}
        assert set(samples) == {("llm", 0), ("llm", 1)}
        s0, s1 = samples[("llm", 0)], samples[("llm", 1)]
        assert s0.step == 3 and s0.pid == os.getpid() and s0.world_size == 2
        assert s0.step_time_s == pytest.approx(0.5)
        assert s1.step_time_s == pytest.approx((1.5 + 2.5 + 3.5) / 3)  # the short moving average
        assert s0.last_checkpoint_step == 3 and s0.checkpoint_path.endswith("step-0000000003")
        assert s0.last_checkpoint_ms > 0
        assert s1.last_checkpoint_step == 0
        # request_checkpoint: rank 0 and 1 have no signal, so they are asked over the socket.
        assert gateway.request_checkpoint("llm") == 2
        assert gateway.request_checkpoint("other-job") == 0
        await wait_for(
            lambda: r0.checkpoint_requested and r1.checkpoint_requested, timeout=5, what="socket checkpoint request"
        )
    finally:
        r0.close()
        r1.close()


async def test_peer_pid_beats_claimed_pid_and_bad_lines_are_ignored(gateway: JobGateway) -> None:
    _reader, writer = await asyncio.open_unix_connection(gateway.socket_path)
    try:
        writer.write(b"not json\n")
        writer.write(b'{"op": "step", "job": "", "rank": 0, "step": 1}\n')
        writer.write(
            json.dumps(
                {"op": "register", "job": "x", "rank": 0, "pid": 1, "world_size": 1, "signal": "SIGUSR1"}
            ).encode()
            + b"\n"
        )
        await writer.drain()
        await wait_for(lambda: len(gateway.ranks()) == 1, timeout=5, what="registration")
        (state,) = gateway.ranks()
        assert state.pid == os.getpid(), "the kernel's peer pid, not pid 1 the client claimed"
    finally:
        writer.close()
        await writer.wait_closed()


async def test_forgets_dead_and_silent_ranks(short_dir: Path) -> None:
    alive = {111: True, 222: True}
    gw = JobGateway(str(short_dir / "g.sock"), stale_after_s=3600, alive=lambda pid: alive.get(pid, False))
    gw.handle({"op": "register", "job": "j", "rank": 0, "pid": 111, "world_size": 2})
    gw.handle({"op": "register", "job": "j", "rank": 1, "pid": 222, "world_size": 2})
    assert len(gw.ranks()) == 2
    alive[222] = False
    assert [(r.job, r.rank) for r in gw.ranks()] == [("j", 0)]
    gw.stale_after_s = 0.0
    await asyncio.sleep(0.01)
    assert gw.ranks() == []


async def test_checkpoint_request_signals_a_real_training_process(gateway: JobGateway, short_dir: Path) -> None:
    ckpt = short_dir / "ckpt"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(TRAIN),
        "--job",
        "train",
        "--steps",
        "400",
        "--step-time",
        "0.05",
        "--checkpoint-dir",
        str(ckpt),
        "--checkpoint-every",
        "0",
        "--socket",
        gateway.socket_path,
        stdout=asyncio.subprocess.PIPE,
    )
    lines: list[str] = []

    async def read() -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            lines.append(raw.decode().strip())

    reader = asyncio.create_task(read())
    try:
        await wait_for(
            lambda: any(r.job == "train" and r.step >= 2 for r in gateway.ranks()),
            timeout=20,
            what="the trainer registered and stepping",
        )
        (state,) = gateway.ranks()
        assert state.pid == proc.pid and state.signal_name == "SIGUSR1"
        assert gateway.request_checkpoint("train") == 1
        await wait_for(
            lambda: any(line.startswith("checkpoint step") for line in lines),
            timeout=10,
            what="the trainer checkpointed on request",
        )
        await wait_for(
            lambda: gateway.ranks()[0].last_checkpoint_step > 0, timeout=5, what="checkpoint_done reached the gateway"
        )
        done = gateway.ranks()[0]
        assert await asyncio.to_thread(os.path.isfile, os.path.join(done.checkpoint_path, "rank-0.COMPLETE"))
        assert lines[0].startswith("start job=train rank=0 world_size=1")
        assert lines[1] == "fresh start"
        proc.terminate()  # SIGTERM: the trainer checkpoints and exits 143
        assert await asyncio.wait_for(proc.wait(), 10) == 143
        await wait_for(lambda: gateway.ranks() == [], timeout=5, what="the dead rank forgotten")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader


async def test_training_without_agent_runs_to_the_end(short_dir: Path) -> None:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(TRAIN),
        "--job",
        "solo",
        "--steps",
        "5",
        "--step-time",
        "0.01",
        "--checkpoint-dir",
        str(short_dir / "ck"),
        "--checkpoint-every",
        "2",
        "--socket",
        str(short_dir / "no-agent.sock"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), 20)
    assert proc.returncode == 0, err
    text = out.decode().splitlines()
    assert text[-1] == "done step 5"
    assert "checkpoint step 4 path=" + str(short_dir / "ck" / "step-0000000004") in text
    assert b"agent not reachable" in err
    # A second run resumes from the last complete checkpoint.
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(TRAIN),
        "--job",
        "solo",
        "--steps",
        "7",
        "--step-time",
        "0.01",
        "--checkpoint-dir",
        str(short_dir / "ck"),
        "--socket",
        str(short_dir / "no-agent.sock"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 20)
    text = out.decode().splitlines()
    assert text[1] == "resumed from step 5" and text[2] == "step 6" and text[-1] == "done step 7"


async def test_end_to_end_controller_registry_and_checkpoint_command(short_dir: Path, tmp_path: Path) -> None:
    """A job on a real agent shows up in the controller's JobRegistry; a CHECKPOINT_REQUEST reaches it."""
    from agent.factory import build_agent
    from agent.runtime import AgentConfig
    from agent.sim.node import SimNode
    from controller.jobs.registry import JobRegistry
    from controller.service import Controller, ControllerConfig
    from starpulse.v1 import service_pb2 as spb
    from tests.helpers import free_port

    port = free_port()
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{port}", http="127.0.0.1:0", db_path=tmp_path / "controller.db", sweep_interval_s=0.2
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    registry = JobRegistry(ctl.store.connection, ctl.clock)
    ctl.registry.listeners.append(registry)
    sock = str(short_dir / "jobs.sock")
    agent = build_agent(
        AgentConfig(
            node_id="node-000",
            controllers=[f"127.0.0.1:{port}"],
            interval_s=0.2,
            buffer_path=str(tmp_path / "buffer.db"),
            job_socket=sock,
        ),
        "sim",
        sim=SimNode("node-000", tmp_path / "hw"),
    )
    agent.link.backoff.initial_s = 0.1
    stop = asyncio.Event()
    task = asyncio.create_task(agent.run(stop))
    job = StarpulseJob(
        "e2e", checkpoint_dir=short_dir / "ck", socket_path=sock, signal_number=None, reconnect_interval_s=0.05
    )
    try:
        await wait_for(lambda: os.path.exists(sock), timeout=20, what="the agent's job socket")
        job.register()
        step = 0

        async def progressed() -> None:
            nonlocal step
            while True:
                step += 1
                job.step(step, 0.01)
                await asyncio.sleep(0.02)

        stepping = asyncio.create_task(progressed())
        try:
            await wait_for(
                lambda: registry.job("e2e") is not None and registry.job("e2e").step > 0,  # type: ignore[union-attr]
                timeout=20,
                what="job progress at the controller",
            )
            assert registry.jobs_of("node-000") == ["e2e"]
            ctl.registry.send_command(
                "node-000", spb.Command(id="ck-1", kind=spb.COMMAND_KIND_CHECKPOINT_REQUEST, args={"job": "e2e"})
            )
            await wait_for(lambda: job.checkpoint_requested, timeout=10, what="the checkpoint request at the job")
            job.save_checkpoint(step, b"state")
            await wait_for(
                lambda: registry.job("e2e").last_complete_step > 0,  # type: ignore[union-attr]
                timeout=10,
                what="the complete checkpoint at the controller",
            )
        finally:
            stepping.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stepping
    finally:
        job.close()
        stop.set()
        await task
        await ctl.stop()


async def test_phases_reach_the_report_and_a_restarted_agent_keeps_the_step(short_dir: Path) -> None:
    gw = JobGateway(str(short_dir / "p.sock"), stale_after_s=3600, alive=lambda pid: True)
    gw.handle({"op": "register", "job": "j", "rank": 0, "pid": 111, "world_size": 1})
    [state] = gw.ranks()
    assert state.phase == "starting" and state.phase_since_ms > 0
    gw.handle({"op": "step", "job": "j", "rank": 0, "step": 1, "step_time_s": 0.5})
    assert gw.ranks()[0].phase == "training"  # a step means training; the library sends no phase for it
    gw.handle({"op": "phase", "job": "j", "rank": 0, "phase": "checkpointing", "step": 1})
    gw.handle({"op": "phase", "job": "j", "rank": 0, "phase": "napping", "step": 1})  # not a phase: ignored
    report = tpb.Report()
    JobCollector(gw).collect(report)
    [sample] = report.job_steps
    assert (sample.phase, sample.step) == ("checkpointing", 1) and sample.phase_since_ms > 0
    # A new agent (empty gateway) hears the rank re-register with where it is, not step 0.
    fresh = JobGateway(str(short_dir / "q.sock"), stale_after_s=3600, alive=lambda pid: True)
    fresh.handle(
        {"op": "register", "job": "j", "rank": 0, "pid": 111, "world_size": 1, "phase": "training", "step": 41}
    )
    assert (fresh.ranks()[0].step, fresh.ranks()[0].phase) == (41, "training")
