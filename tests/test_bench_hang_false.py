"""The false-hang figure's harness (bench/hang_false.py) counts what it should: healthy training
with checkpoints, evaluation passes, a straggler and an agent restart opens no ``job_hang``; the
same run with every rank stopped opens one (so a 0 from it means something)."""

from __future__ import annotations

from pathlib import Path

from bench.hang_false import run_false_hangs


def test_healthy_training_opens_no_hang(tmp_path: Path) -> None:
    run = run_false_hangs(tmp_path, seed=3, minutes=20)
    assert run.job_hang_incidents == 0
    assert run.checkpoints >= 3 and run.evaluations >= 1 and run.steps_trained > 100


def test_the_same_run_with_every_rank_stopped_opens_one(tmp_path: Path) -> None:
    run = run_false_hangs(tmp_path, seed=3, minutes=20, stop_at_s=1100)  # in a training stretch
    assert run.job_hang_incidents == 1
