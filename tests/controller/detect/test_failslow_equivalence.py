"""The incremental fail-slow evaluation reaches the verdicts of the full one, change for change.

The detector keeps its peer groups as nodes report and compares only the groups whose data
changed (controller.detect.failslow_groups). failslow_v0 is the detector before that: every
node regrouped and every group compared on every evaluation. Both get the same reports on one
FakeClock, through stragglers appearing and recovering, jobs starting and going stale, nodes
going quiet, leaving and coming back, and the peer map changing under them; every evaluation's
condition changes must be the same.
"""

from __future__ import annotations

import random
import sqlite3
from typing import Any

import pytest

from controller.detect.failslow import FailSlowConfig, FailSlowDetector
from controller.detect.model import ConditionChange
from controller.detect.pipeline import Detection
from controller.detect.rules import load_rules
from controller.fabric.generate import generate_fabric
from controller.ingest.registry import NodeRecord
from controller.jobs.registry import JobRegistry
from controller.metrics import ControllerMetrics
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.controller.detect import failslow_v0

SIGNALS = {"sm_clock_mhz": 1980.0, "power_w": 650.0, "gpu_util_pct": 95.0, "nic_gbps": 380.0, "step_time_s": 2.0}
CONFIG: dict[str, Any] = {
    "window_s": 60,
    "min_samples": 3,
    "persist_evaluations": 2,
    "min_group_size": 4,
    "recent_samples": 3,
    "sample_every_s": 0,
    "job_ttl_s": 25,
}


def _view(changes: list[ConditionChange]) -> list[tuple[Any, ...]]:
    return [
        (
            c.kind,
            c.condition.component,
            c.condition.message,
            c.condition.evidence,
            c.condition.count,
            c.condition.first_seen_ms,
            c.condition.last_seen_ms,
            c.condition.resolved_ms,
        )
        for c in changes
    ]


class Fleet:
    """Nodes in blocks of eight, some running jobs; stragglers, quiet nodes and departures at random."""

    def __init__(self, seed: int, nodes: int = 48) -> None:
        self.rng = random.Random(seed)
        self.nodes = [f"node-{i:03d}" for i in range(nodes)]
        self.block = {n: f"block:{i // 8}" for i, n in enumerate(self.nodes)}
        self.slow: dict[str, float] = {}
        self.job: dict[str, str] = {}
        self.quiet: set[str] = set()

    def group_of(self, node: str) -> str | None:
        return self.block.get(node)

    def group_map(self) -> dict[str, str]:
        return dict(self.block)

    def churn(self) -> list[str]:
        """One round's changes to the fleet; returns the nodes to forget."""
        rng = self.rng
        if rng.random() < 0.3:  # a straggler appears
            self.slow[rng.choice(self.nodes)] = rng.choice((0.5, 0.6, 0.8, 1.5))
        if self.slow and rng.random() < 0.2:  # one recovers
            del self.slow[rng.choice(sorted(self.slow))]
        if rng.random() < 0.1:  # a job starts on a block's worth of nodes
            start = rng.randrange(0, len(self.nodes) - 12)
            name = f"job-{rng.randrange(100)}"
            for n in self.nodes[start : start + rng.randrange(4, 13)]:
                self.job[n] = name
        if self.job and rng.random() < 0.08:  # a job ends: its nodes stop naming it
            ended = rng.choice(sorted(set(self.job.values())))
            self.job = {n: j for n, j in self.job.items() if j != ended}
        if rng.random() < 0.1:
            self.quiet.add(rng.choice(self.nodes))
        if self.quiet and rng.random() < 0.15:
            self.quiet.discard(rng.choice(sorted(self.quiet)))
        if rng.random() < 0.06:  # a whole group goes quiet: its windows age out with no report to say so
            block = rng.choice(sorted(set(self.block.values())))
            self.quiet.update(n for n, b in self.block.items() if b == block and n not in self.job)
        if self.quiet and rng.random() < 0.05:
            self.quiet.clear()
        if rng.random() < 0.05:  # the peer map changes (a node moves block, one leaves the map)
            node = rng.choice(self.nodes)
            if rng.random() < 0.5:
                self.block[node] = f"block:{rng.randrange(6)}"
            else:
                self.block.pop(node, None)
        return [rng.choice(self.nodes)] if rng.random() < 0.04 else []

    def sample(self, node: str) -> tuple[dict[str, float], str | None]:
        rng = self.rng
        f = self.slow.get(node, 1.0)
        values: dict[str, float] = {}
        for signal, base in SIGNALS.items():
            if rng.random() < 0.1:
                continue  # this report lacked it
            if signal == "step_time_s":
                if node not in self.job:
                    continue
                value = base / f
            else:
                value = base * f
            values[signal] = value * (1 + rng.gauss(0, 0.02))
        if rng.random() < 0.02:
            values["power_w"] = float("nan")  # a bad read: dropped by both
        return values, self.job.get(node)


def _run(
    seed: int, *, use_map: bool, nodes_per_step: float, rounds: int = 160, wall_steps: bool = False, **tuning: Any
) -> int:
    clock = FakeClock(1_000_000)
    fleet = Fleet(seed)
    config = CONFIG | tuning
    old = failslow_v0.FailSlowDetector(failslow_v0.FailSlowConfig(**config), group_of=fleet.group_of, clock=clock)
    new = FailSlowDetector(
        FailSlowConfig(**config),
        group_of=fleet.group_of,
        clock=clock,
        group_map=fleet.group_map if use_map else None,
    )
    seen = 0
    for round_ in range(rounds):
        for node in fleet.churn():
            assert _view([c] if (c := old.forget(node)) else []) == _view([c] if (c := new.forget(node)) else [])
        if wall_steps and fleet.rng.random() < 0.03:  # an NTP step back: a job gone stale is fresh again
            clock.set_ms(clock.time_ms() - fleet.rng.choice((3_000, 20_000, 40_000)))
        else:
            clock.advance(fleet.rng.choice((1, 2, 5, 5, 5, 9)))
        for node in fleet.nodes:
            if node in fleet.quiet or fleet.rng.random() < 0.2:
                continue
            values, job = fleet.sample(node)
            old.append(node, dict(values), job)
            new.append(node, dict(values), job)
        if round_ % 2:
            continue  # evaluations every other round: reports in between accumulate
        expected = old.evaluate()
        got: list[ConditionChange] = []
        for _ in new.evaluation_steps(got, nodes_per_step):
            pass
        assert _view(got) == _view(expected), f"seed {seed} round {round_}"
        assert [c.component for c in new.active()] == [c.component for c in old.active()]
        seen += len(expected)
    return seen


@pytest.mark.parametrize("seed", range(6))
def test_incremental_evaluation_matches_the_full_one(seed: int) -> None:
    assert _run(seed, use_map=True, nodes_per_step=500) > 0  # something opened and resolved: not vacuous


@pytest.mark.parametrize("seed", range(3))
def test_with_a_per_node_group_of_and_small_steps(seed: int) -> None:
    assert _run(seed, use_map=False, nodes_per_step=7) > 0


@pytest.mark.parametrize("seed", range(3))
def test_with_more_recent_samples_than_min_samples(seed: int) -> None:
    """A window shorter than recent_samples is compared: its latest median follows samples leaving too."""
    assert _run(seed, use_map=True, nodes_per_step=500, min_samples=2, recent_samples=5, min_group_size=3) > 0


@pytest.mark.parametrize("seed", range(16))
def test_with_the_wall_clock_stepping_back(seed: int) -> None:
    """Sample times out of order and jobs fresh again: the same verdicts as comparing everything."""
    assert _run(seed, use_map=True, nodes_per_step=500, wall_steps=True) > 0


def test_the_fuzz_opens_updates_and_resolves() -> None:
    """The inputs reach every kind of change, or the comparison above proves little."""
    clock = FakeClock(1_000_000)
    fleet = Fleet(0)
    det = FailSlowDetector(FailSlowConfig(**CONFIG), group_of=fleet.group_of, clock=clock, group_map=fleet.group_map)
    kinds: set[str] = set()
    for _ in range(160):
        fleet.churn()
        clock.advance(5)
        for node in fleet.nodes:
            if node not in fleet.quiet:
                det.append(node, *fleet.sample(node))
        kinds.update(c.kind for c in det.evaluate())
    assert kinds == {"opened", "updated", "resolved"}


def test_the_pipelines_peer_map_is_its_per_node_answer() -> None:
    """``Detection._peer_groups`` (one map per evaluation) says what ``_peer_group`` says node by node:
    the first job by name, declared or by a rank, else the node's block, else nothing."""
    clock = FakeClock(1_000_000)
    conn = sqlite3.connect(":memory:", isolation_level=None)
    jobs = JobRegistry(conn, clock)
    fabric = generate_fabric(64, gpus_per_node=8, rails=8, nodes_per_block=16, spines=8)
    nodes = sorted(fabric.nodes())
    rng = random.Random(3)
    peers = {"jobs_of": jobs.jobs_of, "first_jobs": jobs.first_job_by_node}
    det = Detection(conn, load_rules(), fabric, ControllerMetrics(), clock=clock, **peers)
    jobs.register_job("zeta", nodes[:20])
    jobs.register_job("alpha", nodes[10:14])  # overlaps zeta: alpha comes first
    for node in rng.sample(nodes, 12):  # ranks of jobs nobody declared, some on declared nodes
        record = NodeRecord(node_id=node, role=ipb.NODE_ROLE_COMPUTE, state="online", first_seen_ms=0, last_seen_ms=0)
        report = tpb.Report(seq=1)
        for rank, job in enumerate(rng.sample(["beta", "mid", "omega"], 2)):
            report.job_steps.add(job=job, rank=rank, step=1, step_time_s=1.0)
        jobs.on_report(record, report)
    expected = {n: g for n in [*nodes, "not-in-the-fabric"] if (g := det._peer_group(n)) is not None}
    assert det._peer_groups(jobs.first_job_by_node) == expected
    assert {g for g in expected.values() if g.startswith("job:")} >= {"job:alpha", "job:zeta", "job:beta"}
    assert any(g.startswith("block:") for g in expected.values())
