"""The controller's job registry: progress from reports, last complete checkpoint, restart
accounting, persistence."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from controller.ingest.registry import IngestListener, NodeRecord
from controller.jobs.registry import INTERRUPTED, RESUMING, RUNNING, JobRegistry
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb


def node(node_id: str) -> NodeRecord:
    return NodeRecord(node_id=node_id, role=ipb.NODE_ROLE_COMPUTE, state="online", first_seen_ms=0, last_seen_ms=0)


def report(*samples: tuple[str, int, int, int], world: int = 2, pid: int = 100) -> tpb.Report:
    """samples: (job, rank, step, last_checkpoint_step)."""
    r = tpb.Report()
    for job, rank, step, ckpt in samples:
        r.job_steps.add(
            job=job,
            rank=rank,
            step=step,
            step_time_s=0.5,
            last_checkpoint_step=ckpt,
            checkpoint_path=f"/ckpt/{job}/step-{ckpt:010d}" if ckpt else "",
            last_checkpoint_ms=5,
            pid=pid + rank,
            world_size=world,
        )
    return r


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store(tmp_path / "controller.db")
    yield s
    s.close()


def test_is_an_ingest_listener(store: Store) -> None:
    reg = JobRegistry(store.connection, FakeClock(1_000_000))
    listener: IngestListener = reg  # mypy checks the protocol
    assert all(callable(getattr(listener, m)) for m in ("on_report", "on_events", "on_presence"))
    reg.on_events(node("a"), [])
    reg.on_presence(node("a"), "online", "unreachable")


def test_progress_nodes_and_last_complete_checkpoint(store: Store) -> None:
    reg = JobRegistry(store.connection, FakeClock(1_000_000))
    reg.on_report(node("gpu-001"), report(("llm", 0, 25, 20)))
    job = reg.job("llm")
    assert job is not None and job.step == 25 and job.world_size == 2
    assert job.last_complete_step == 0, "rank 1 has not reported: nothing is known complete"
    reg.on_report(node("gpu-002"), report(("llm", 1, 24, 10)))
    job = reg.job("llm")
    assert job is not None
    assert job.last_complete_step == 10 and job.last_complete_path == "/ckpt/llm/step-0000000010"
    assert reg.nodes_of("llm") == ["gpu-001", "gpu-002"]
    assert reg.jobs_of("gpu-002") == ["llm"] and reg.jobs_of("gpu-009") == []
    assert job.ranks[1].node == "gpu-002" and job.ranks[1].step == 24
    reg.on_report(node("gpu-002"), report(("llm", 1, 31, 30)))
    assert reg.job("llm").last_complete_step == 20  # type: ignore[union-attr]
    # It only moves forward (a rank restarting with an older view does not undo completeness).
    reg.on_report(node("gpu-002"), report(("llm", 1, 3, 0)))
    assert reg.job("llm").last_complete_step == 20  # type: ignore[union-attr]


def test_declared_jobs_and_ranks_leaving_a_node(store: Store) -> None:
    reg = JobRegistry(store.connection, FakeClock(1_000_000))
    reg.register_job("llm", ["gpu-001", "gpu-002"], "/ckpt/llm", world_size=2)
    assert reg.nodes_of("llm") == ["gpu-001", "gpu-002"]
    assert [j.job for j in reg.jobs()] == ["llm"]
    reg.on_report(node("gpu-003"), report(("other", 0, 5, 0), world=1))
    assert reg.jobs_of("gpu-003") == ["other"]
    reg.on_report(node("gpu-003"), tpb.Report())  # the agent no longer lists the rank: it left
    assert reg.jobs_of("gpu-003") == []
    assert reg.job("other") is not None and reg.job("nope") is None


def test_a_rank_that_moved_stays_with_its_new_node(tmp_path: Path) -> None:
    """Ranks leave only the node that listed them; after a restart the first report still sees restored ones."""
    s = Store(tmp_path / "c.db")
    try:
        reg = JobRegistry(s.connection, FakeClock(1_000_000))
        reg.on_report(node("gpu-001"), report(("llm", 0, 5, 0), ("llm", 1, 5, 0)))
        reg.on_report(node("gpu-002"), report(("llm", 1, 6, 0)))  # rank 1 moved (rescheduled)
        reg.on_report(node("gpu-001"), report(("llm", 0, 7, 0)))  # gpu-001 no longer lists rank 1
        job = reg.job("llm")
        assert job is not None and job.ranks[1].node == "gpu-002" and job.ranks[0].node == "gpu-001"
        reg.on_report(node("gpu-002"), tpb.Report())  # now it left gpu-002 too
        assert sorted(reg.job("llm").ranks) == [0]  # type: ignore[union-attr]

        reopened = JobRegistry(s.connection, FakeClock(1_000_000))  # ranks restored from the database
        assert reopened.jobs_of("gpu-001") == ["llm"]
        reopened.on_report(node("gpu-001"), tpb.Report())  # first report after the restart lists none
        assert reopened.jobs_of("gpu-001") == []
    finally:
        s.close()


def test_interruption_and_resume_accounting(store: Store) -> None:
    clock = FakeClock(1_000_000)
    reg = JobRegistry(store.connection, clock)
    reg.register_job("llm", ["gpu-001", "gpu-002"], "/ckpt/llm", world_size=2)
    reg.on_report(node("gpu-001"), report(("llm", 0, 47, 40)))
    reg.on_report(node("gpu-002"), report(("llm", 1, 47, 40)))
    t0 = clock.time_ms()
    job = reg.mark_interrupted("llm", t0, "evict gpu-002: pending row remap")
    assert job.state == INTERRUPTED and job.history[-1].interrupted_step == 47
    assert reg.mark_interrupted("llm", t0 + 5, "again").history[-1].interrupted_ms == t0, "idempotent while down"

    clock.set_ms(t0 + 20_000)
    job = reg.mark_resumed("llm", clock.time_ms(), resumed_from_step=40)
    assert job.state == RESUMING and job.restarts == 1 and job.steps_lost == 7 and job.resumed_from_step == 40
    # Stale samples (same step, same pid, same node) are not progress.
    clock.set_ms(t0 + 25_000)
    reg.on_report(node("gpu-001"), report(("llm", 0, 47, 40)))
    assert reg.job("llm").state == RESUMING  # type: ignore[union-attr]
    # Rank 1 comes back on the spare and steps past the checkpoint: downtime ends here.
    clock.set_ms(t0 + 30_000)
    reg.on_report(node("spare-01"), report(("llm", 1, 41, 40), pid=900))
    job = reg.job("llm")  # type: ignore[assignment]
    assert job is not None and job.state == RUNNING
    assert job.downtime_s == pytest.approx(30.0)
    assert job.last_restart is not None and job.last_restart.resumed_from_checkpoint is True
    assert job.ranks[1].node == "spare-01"
    assert "spare-01" in reg.nodes_of("llm")
    assert job.to_dict()["restarts"] == 1 and job.to_dict()["steps_lost"] == 7

    # A second interruption adds up; an open one counts its downtime up to now.
    reg.on_report(node("spare-01"), report(("llm", 1, 55, 50), pid=900))
    clock.set_ms(t0 + 100_000)
    reg.mark_interrupted("llm", clock.time_ms(), "node lost")
    clock.set_ms(t0 + 110_000)
    assert reg.job("llm").downtime_s == pytest.approx(40.0)  # type: ignore[union-attr]
    reg.mark_resumed("llm", clock.time_ms(), resumed_from_step=50)
    job = reg.job("llm")  # type: ignore[assignment]
    assert job is not None and job.restarts == 2 and job.steps_lost == 7 + 5


def test_resume_without_recorded_interruption_still_counts(store: Store) -> None:
    clock = FakeClock(1_000_000)
    reg = JobRegistry(store.connection, clock)
    reg.on_report(node("a"), report(("j", 0, 12, 10), world=1))
    job = reg.mark_resumed("j", clock.time_ms(), 10)
    assert job.restarts == 1 and job.steps_lost == 2


def test_survives_reopen(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000)
    store = Store(tmp_path / "c.db")
    reg = JobRegistry(store.connection, clock)
    reg.register_job("llm", ["gpu-001"], "/ckpt/llm", world_size=2)
    reg.on_report(node("gpu-001"), report(("llm", 0, 22, 20)))
    reg.on_report(node("gpu-002"), report(("llm", 1, 22, 20)))
    reg.mark_interrupted("llm", clock.time_ms(), "evict")
    reg.mark_resumed("llm", clock.time_ms() + 1000, 20)
    store.close()

    store = Store(tmp_path / "c.db")
    try:
        again = JobRegistry(store.connection, clock)
        job = again.job("llm")
        assert job is not None
        assert job.checkpoint_dir == "/ckpt/llm" and job.declared_nodes == ["gpu-001"]
        assert job.last_complete_step == 20 and job.state == RESUMING
        assert job.restarts == 1 and job.steps_lost == 2 and job.resumed_from_step == 20
        assert sorted(job.ranks) == [0, 1] and again.jobs_of("gpu-002") == ["llm"]
        # Downtime still closes on the first step after the reopen.
        clock.advance(5)
        again.on_report(node("gpu-002"), report(("llm", 1, 21, 20), pid=777))
        assert again.job("llm").state == RUNNING  # type: ignore[union-attr]
        assert again.job("llm").downtime_s == pytest.approx(5.0)  # type: ignore[union-attr]
    finally:
        store.close()


def test_step_progress_writes_are_throttled(store: Store) -> None:
    clock = FakeClock(1_000_000)
    reg = JobRegistry(store.connection, clock, persist_interval_ms=30_000)
    reg.on_report(node("a"), report(("j", 0, 1, 0), world=1))
    clock.advance(5)
    reg.on_report(node("a"), report(("j", 0, 2, 0), world=1))
    row = store.connection.execute("SELECT step FROM heal_job_ranks WHERE job='j'").fetchone()
    assert row == (1,), "step-only progress waits for the persist interval"
    assert reg.job("j").step == 2  # type: ignore[union-attr]
    clock.advance(30)
    reg.on_report(node("a"), report(("j", 0, 3, 0), world=1))
    assert store.connection.execute("SELECT step FROM heal_job_ranks WHERE job='j'").fetchone() == (3,)
    clock.advance(1)
    reg.on_report(node("a"), report(("j", 0, 4, 4), world=1))  # a checkpoint is written at once
    assert store.connection.execute("SELECT last_checkpoint_step FROM heal_job_ranks").fetchone() == (4,)
