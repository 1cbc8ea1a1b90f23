"""The demo's parts on their own: its guards' room, the leaf fault's cables, the job's figures."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.sim.node import SimNode
from controller.heal.guards import fleet_share_refusal
from controller.jobs.registry import JobRecord, RankRecord, RestartRecord
from starpulse.app.demo import demo_fabric, demo_guards, job_lines
from starpulse.app.demo_faults import FAULT_EVERY_S, LeafFault


@pytest.mark.parametrize("fleet", [3, 5, 17, 33])
def test_the_demo_lets_two_nodes_be_out_at_once_whatever_its_size(fleet: int) -> None:
    share = demo_guards(fleet).max_fleet_share
    assert fleet_share_refusal("b", {"a"}, fleet, share) is None
    assert fleet_share_refusal("c", {"a", "b"}, fleet, share) is not None


def test_the_demo_budget_lets_every_fault_its_pace_injects_in_a_window_be_healed() -> None:
    guards = demo_guards(17)
    assert guards.max_evictions_per_window * FAULT_EVERY_S[0] >= guards.window_s


def test_a_leaf_fault_downs_the_cable_of_every_node_on_the_leaf(tmp_path: Path) -> None:
    fabric = demo_fabric(4)
    sims = {n: SimNode(n, tmp_path / n, seed=i) for i, n in enumerate(fabric.nodes())}
    faults = LeafFault.candidates(fabric, sims, "node-000")
    assert faults and all(len(f.ends) > 1 for f in faults)  # never a one-node leaf (that is a NIC fault)
    leaf = faults[0]
    assert {sim.node_id for sim, _ in leaf.ends} == {"node-000", "node-001", "node-002", "node-003"}
    assert leaf.describe() == "4 cables down at once"


def test_job_lines_give_each_resume_and_an_ettr_that_counts_downtime_and_lost_steps() -> None:
    job = JobRecord(job="demo-train", first_seen_ms=0, now_ms=100_000)
    job.ranks = {0: RankRecord("demo-train", 0, "node-001", step=190, step_time_s=0.5)}
    job.history = [
        RestartRecord(40_000, "gpu_fault on node-000", 80, resumed_ms=40_500, resumed_from_step=70,
                      first_step_ms=44_000, first_step=71),
    ]  # fmt: skip
    lines = job_lines(job, 100_000)
    assert lines[0] == "job demo-train: running at step 190, 1 restart, 10 steps lost, 4s down"
    assert lines[1] == "  fault 1 (gpu_fault on node-000): resumed after 4.0s from step 70, 10 steps lost"
    # 100 s of wall time, 4 s down, 10 steps x 0.5 s redone: 91 s productive
    assert lines[2] == "ETTR 91.0% (91s productive of 100s)"


def test_job_lines_without_a_step_say_so() -> None:
    assert job_lines(JobRecord(job="j"), 1000) == ["job j: 0 requeues; no training process reported a step"]


def test_job_lines_of_a_job_waiting_for_capacity_keep_its_steps_and_count_the_open_downtime() -> None:
    """No rank runs while the job waits for nodes: its furthest step comes from its history,
    and the interruption still open counts as time down up to now."""
    job = JobRecord(job="demo-train", state="pending", first_seen_ms=0, now_ms=100_000)
    job.history = [RestartRecord(60_000, "gpu_fault on node-009", 452)]
    lines = job_lines(job, 100_000)
    assert lines[0] == "job demo-train: pending at step 452, 0 restarts, 0 steps lost, 40s down"
    assert lines[-1] == "ETTR 60.0% (60s productive of 100s)"
