"""The job-side library: atomic checkpoints, resume, checkpoint requests, an absent agent."""

from __future__ import annotations

import json
import os
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from starpulse.job import StarpulseJob, step_dir_name


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """Unix socket paths are limited to ~107 bytes; pytest's tmp_path can be longer."""
    with tempfile.TemporaryDirectory(prefix="spj-", dir="/tmp") as d:
        yield Path(d)


def make(tmp_path: Path, rank: int = 0, world_size: int = 1, **kw: object) -> StarpulseJob:
    return StarpulseJob(
        "llm",
        rank=rank,
        world_size=world_size,
        checkpoint_dir=tmp_path / "ckpt",
        socket_path=str(tmp_path / "absent.sock"),
        signal_number=None,
        **kw,
    )  # type: ignore[arg-type]


def test_save_then_resume_round_trips_bytes_and_dicts(tmp_path: Path) -> None:
    job = make(tmp_path)
    path = job.save_checkpoint(10, b"\x00weights")
    assert Path(path).name == step_dir_name(10)
    assert job.latest_checkpoint() == (10, path)
    assert job.resume() == (10, b"\x00weights")
    job.save_checkpoint(20, {"lr": 0.1, "step": 20})
    assert job.resume() == (20, {"lr": 0.1, "step": 20})
    assert not any(p.name.startswith(".") for p in Path(path).iterdir()), "no tmp files left behind"


def test_crash_mid_write_is_never_latest(tmp_path: Path) -> None:
    job = make(tmp_path)
    job.save_checkpoint(10, b"good")
    # A crash while writing step 20: the tmp state file exists, no rename, no COMPLETE marker.
    crashed = tmp_path / "ckpt" / step_dir_name(20)
    crashed.mkdir()
    (crashed / f".rank-0.ckpt.tmp-{os.getpid()}").write_bytes(b"half")
    # A crash after the state rename but before the marker: also not complete.
    crashed30 = tmp_path / "ckpt" / step_dir_name(30)
    crashed30.mkdir()
    (crashed30 / "rank-0.ckpt").write_bytes(b"whole but unmarked")
    assert job.latest_checkpoint() == (10, str(tmp_path / "ckpt" / step_dir_name(10)))
    assert job.resume() == (10, b"good")


def test_resume_picks_newest_complete_and_skips_corrupt(tmp_path: Path) -> None:
    job = make(tmp_path)
    for step in (5, 15, 10):
        job.save_checkpoint(step, {"step": step})
    assert job.resume() == (15, {"step": 15})
    # Bit rot in the newest: its manifest no longer matches, so resume falls back.
    (tmp_path / "ckpt" / step_dir_name(15) / "rank-0.ckpt").write_bytes(b'{"step": 99}')
    assert job.resume() == (10, {"step": 10})


def test_multi_rank_checkpoint_complete_only_when_every_rank_finished(tmp_path: Path) -> None:
    r0, r1 = make(tmp_path, rank=0, world_size=2), make(tmp_path, rank=1, world_size=2)
    r0.save_checkpoint(10, b"r0-10")
    r1.save_checkpoint(10, b"r1-10")
    r0.save_checkpoint(20, b"r0-20")  # rank 1 died before writing step 20
    assert r0.latest_checkpoint() is not None and r0.latest_checkpoint()[0] == 10  # type: ignore[index]
    assert r1.resume() == (10, b"r1-10")
    assert r0.resume() == (10, b"r0-10")


def test_no_checkpoint_yet(tmp_path: Path) -> None:
    job = make(tmp_path)
    assert job.latest_checkpoint() is None
    assert job.resume() is None


def test_sigusr1_sets_checkpoint_requested(tmp_path: Path) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    job = StarpulseJob("llm", checkpoint_dir=tmp_path, socket_path=str(tmp_path / "absent.sock"))
    try:
        assert not job.checkpoint_requested
        os.kill(os.getpid(), signal.SIGUSR1)
        assert job.checkpoint_requested
        job.save_checkpoint(3, b"x")
        assert not job.checkpoint_requested, "a checkpoint clears the request"
    finally:
        job.close()
    assert signal.getsignal(signal.SIGUSR1) == previous


def test_agent_away_training_carries_on(tmp_path: Path) -> None:
    job = make(tmp_path, reconnect_interval_s=0.0)
    assert job.register() is False
    for step in range(1, 50):
        job.step(step, 0.01)  # no exception, no blocking
    assert not job.checkpoint_requested
    assert job.save_checkpoint(49, b"s")
    job.close()


def test_protocol_lines_and_agent_checkpoint_message(short_dir: Path) -> None:
    path = str(short_dir / "jobs.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    job = StarpulseJob(
        "llm", rank=1, world_size=2, checkpoint_dir=short_dir / "ck", socket_path=path, signal_number=None
    )
    try:
        assert job.register()
        conn, _ = server.accept()
        with conn:
            job.step(7, 0.25)
            job.save_checkpoint(7, b"s")
            conn.settimeout(5)
            data = b""
            while data.count(b"\n") < 5:
                data += conn.recv(4096)
            msgs = [json.loads(line) for line in data.splitlines()]
            # The phase is said only when it changes: the step itself moves "starting" to training
            # (the agent reads that from the step), a checkpoint is bracketed by two phase messages.
            assert [m["op"] for m in msgs] == ["register", "step", "phase", "checkpoint_done", "phase"]
            assert msgs[0]["pid"] == os.getpid() and msgs[0]["world_size"] == 2 and msgs[0]["signal"] is None
            assert msgs[0]["phase"] == "starting" and msgs[0]["step"] == 0
            assert msgs[1] == {"op": "step", "job": "llm", "rank": 1, "step": 7, "step_time_s": 0.25}
            assert msgs[2] == {"op": "phase", "job": "llm", "rank": 1, "phase": "checkpointing", "step": 7}
            assert msgs[3]["step"] == 7 and msgs[3]["path"].endswith(step_dir_name(7))
            assert msgs[4]["phase"] == "training"
            conn.sendall(b'{"op": "checkpoint"}\n')
            for _ in range(100):
                if job.checkpoint_requested:
                    break
                time.sleep(0.01)
            assert job.checkpoint_requested
        # The agent went away: the job notices, keeps going, and does not raise.
        job.step(8, 0.25)
        job.step(9, 0.25)
        assert not job.connected
    finally:
        job.close()
        server.close()
