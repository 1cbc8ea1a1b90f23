"""Real rank processes that wait on each other (examples/train_ranks.py: a TCP barrier every
step) under real agent job gateways; one rank stops, the decision core opens ``job_hang``, and
the agents' command handlers answer COLLECT_STACKS with real ``py-spy`` stacks that name it."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from agent.stacks import find_py_spy
from bench.hang import ODD_RANK, SECOND_ODD_RANK, run_once

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
