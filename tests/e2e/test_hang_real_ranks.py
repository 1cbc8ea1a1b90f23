"""Real rank processes that wait on each other (examples/train_ranks.py: a TCP barrier every
step) under real agent job gateways; one rank stops, the decision core opens ``job_hang``, and
the agents' command handlers answer COLLECT_STACKS with real ``py-spy`` stacks that name it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from agent.stacks import find_py_spy
from bench.hang import ODD_RANK, SECOND_ODD_RANK, run_once
from bench.hang_resume import run_resume

needs_py_spy = pytest.mark.skipif(find_py_spy() is None, reason="py-spy is not installed (dev extra)")


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_one_odd_rank_out_is_named_by_its_step_with_its_node() -> None:
    """Rank 3 spins after the barrier of step 20: its peers finish step 20 and wait in step 21's
    barrier; the job stops, rank 3 is a step behind, and it is the one named, with node-001."""
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_once(Path(d), "after_barrier", step_time_s=0.1, hang_step=20, stacks=False)
    assert run.incident_shape == "stalled"
    assert run.suspects == [{"rank": ODD_RANK, "node": "node-001", "step": 19}]


@needs_py_spy
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_everyone_waiting_at_one_step_names_nobody_by_steps_and_the_odd_rank_by_its_stack() -> None:
    """Rank 3 spins before the barrier: everyone else waits inside it at the same step, so the
    steps cannot tell who stalled it; the stacks can (rank 3 is not in wait_for_peers)."""
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_once(Path(d), "before_barrier", step_time_s=0.1, hang_step=20)
    assert run.incident_shape == "stalled" and run.suspects == []
    assert run.stack_suspects is not None
    assert [(s["rank"], s["node"]) for s in run.stack_suspects] == [(ODD_RANK, "node-001")]


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_without_py_spy_the_hang_is_still_an_incident(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("agent.stacks.find_py_spy", lambda configured=None: None)  # as on a node without it
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_once(Path(d), "before_barrier", step_time_s=0.1, hang_step=20)
    assert run.incident_shape == "stalled"
    assert run.stack_suspects == [] and run.stacks_reason == "no stack could be read"


@needs_py_spy
@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_two_suspects_on_two_nodes_are_both_named() -> None:
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_once(
            Path(d), "before_barrier", step_time_s=0.1, hang_step=20, odd_ranks=(ODD_RANK, SECOND_ODD_RANK)
        )
    assert run.stack_suspects is not None
    assert [(s["rank"], s["node"]) for s in run.stack_suspects] == [
        (ODD_RANK, "node-001"),
        (SECOND_ODD_RANK, "node-003"),
    ]


# -- on to the end: the healer acts, the in-memory scheduler requeues, the ranks resume ------------


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_one_odd_rank_out_is_evicted_and_the_job_resumes_from_its_checkpoint() -> None:
    """Rank 3 stops after step 20's barrier, before writing its part of checkpoint 20: the steps
    name it and node-001, the healer evicts node-001, the job is requeued on the spare, and the
    new run's ranks resume from checkpoint 15 (the last every rank completed): first step 16."""
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_resume(Path(d), "after_barrier", step_time_s=0.1, hang_step=20, checkpoint_every=5)
    assert [(c["rank"], c["node"]) for c in run.culprit] == [(ODD_RANK, "node-001")]
    assert run.action == "evict" and run.evicted == ["node-001"]
    assert "node-001" not in run.requeued_on and "node-004" in run.requeued_on
    assert run.resumed_from_step == 15 and run.first_step_after_resume == 16
    assert run.steps_lost == run.steps_redone == 20 - 15


@needs_py_spy
@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_two_suspects_on_two_nodes_are_both_evicted_and_the_job_resumes_on_spares() -> None:
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_resume(
            Path(d), "before_barrier", step_time_s=0.1, hang_step=20, checkpoint_every=5,
            odd_ranks=(ODD_RANK, SECOND_ODD_RANK), max_fleet_share=0.34,
        )  # fmt: skip
    assert run.culprit_from == "stacks"
    assert [(c["rank"], c["node"]) for c in run.culprit] == [(ODD_RANK, "node-001"), (SECOND_ODD_RANK, "node-003")]
    assert run.steps_lost == run.steps_redone  # two requeues, one interruption
    assert run.evicted == ["node-001", "node-003"]
    assert sorted(run.requeued_on) == ["node-000", "node-002", "node-004", "node-005"]
    assert run.resumed_from_step == 15 and run.first_step_after_resume == 16


@pytest.mark.slow
@pytest.mark.timeout(180)
async def test_every_rank_waiting_in_one_place_restarts_in_place_and_evicts_nobody() -> None:
    """The barrier itself is lost at step 20: every rank waits in the same place, nobody is named,
    the job restarts where it ran (no drain) and resumes from checkpoint 15."""
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_resume(Path(d), "barrier_lost", step_time_s=0.1, hang_step=20, checkpoint_every=5)
    assert run.culprit == [] and run.action == "restart_in_place" and run.evicted == []
    assert sorted(run.requeued_on) == ["node-000", "node-001", "node-002", "node-003"]
    if find_py_spy() is not None:
        assert run.stacks_reason.startswith("every rank waits in the same place")
    assert run.resumed_from_step == 15 and run.first_step_after_resume == 16
