"""Real rank processes that wait on each other (examples/train_ranks.py: a TCP barrier every
step) under real agent job gateways; one rank stops, the decision core opens ``job_hang``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench.hang import ODD_RANK, run_once


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_one_odd_rank_out_is_named_with_its_node() -> None:
    """Rank 3 spins after the barrier of step 20: its peers finish step 20 and wait in step 21's
    barrier; the job stops, rank 3 is a step behind, and it is the one named, with node-001."""
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_once(Path(d), "after_barrier", step_time_s=0.1, hang_step=20)
    assert run.incident_shape == "stalled"
    assert run.suspects == [{"rank": ODD_RANK, "node": "node-001", "step": 19}]


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_every_rank_waiting_at_the_same_step_names_nobody() -> None:
    """Rank 3 spins before the barrier: everyone else waits inside it at the same step; the
    steps alone cannot tell who stalled it, so nobody is named (stacks would: item 3)."""
    with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
        run = await run_once(Path(d), "before_barrier", step_time_s=0.1, hang_step=20)
    assert run.incident_shape == "stalled" and run.suspects == []
