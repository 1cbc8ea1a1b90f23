"""Hangs from the job library's steps, through the decision core on a FakeClock.

Reports carry each rank's step and phase (JobStepSample); the hang detector on the jobs
floor judges them and its verdicts become ``job_hang`` incidents through the correlator.
Never a hang: a long checkpoint or evaluation within its bound, agents that restart (the
progress signal is lost, not the progress), a straggler that merely moves slowly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.model import Incident
from controller.detect.pipeline import DetectionConfig
from controller.jobs.hang import HangConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

NODES = [f"node-{i:03d}" for i in range(4)]
RANKS_PER_NODE = 2
REPORT_S = 5
STEP_S = 1.0  # every rank's step time: the training bound is clamp(5 x 1 s, 20 s, 300 s) = 20 s


class Job:
    """Eight ranks on four nodes, stepping on the fake clock; each rank's pace and phase settable."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.step = {r: 0.0 for r in range(len(NODES) * RANKS_PER_NODE)}
        self.pace = dict.fromkeys(self.step, 1.0)  # steps per STEP_S (0: stopped)
        self.phase = dict.fromkeys(self.step, "training")
        self.phase_since = dict.fromkeys(self.step, 0)
        self.silent: set[str] = set()  # nodes whose agent is down: no report at all
        self.unlisted: set[str] = set()  # nodes whose agent lists no ranks (they have not reconnected)

    def node_of(self, rank: int) -> str:
        return NODES[rank // RANKS_PER_NODE]

    def set_phase(self, phase: str, ranks: list[int] | None = None) -> None:
        for r in ranks if ranks is not None else list(self.step):
            self.phase[r] = phase
            self.phase_since[r] = self.clock.time_ms()

    def report(self, node: str, seq: int) -> tpb.Report:
        r = tpb.Report(seq=seq, timestamp_ms=self.clock.time_ms())
        if node in self.unlisted:
            return r
        for rank, step in self.step.items():
            if self.node_of(rank) != node:
                continue
            r.job_steps.add(
                job="llm",
                rank=rank,
                step=int(step),
                step_time_s=STEP_S / self.pace[rank] if self.pace[rank] else STEP_S,
                pid=1000 + rank,
                world_size=len(self.step),
                phase=self.phase[rank],
                phase_since_ms=self.phase_since[rank],
            )
        return r


class Cluster:
    def __init__(self, tmp_path: Path, hang: HangConfig | None = None) -> None:
        self.clock = FakeClock()
        config = ControllerConfig(
            db_path=tmp_path / "c.db",
            heartbeat_timeout_s=3600.0,  # presence is not what these tests are about
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0)),
            hang=hang or HangConfig(),
        )
        self.core = DecisionCore(config, self.clock, Store(config.db_path), ControllerMetrics())
        for node in NODES:
            inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(RANKS_PER_NODE)])
            self.core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="b1"))
        self.job = Job(self.clock)
        self.seq = 0
        self.elapsed = 0

    def run(self, seconds: int, during: Callable[[int], None] = lambda t: None) -> None:
        """Advance one second at a time: ranks step at their pace, nodes report every REPORT_S, the core ticks."""
        for _ in range(seconds):
            self.clock.advance(1.0)
            self.elapsed += 1
            during(self.elapsed)
            for rank, pace in self.job.pace.items():
                if self.job.phase[rank] == "training":
                    self.job.step[rank] += pace / STEP_S
            if self.elapsed % REPORT_S == 0:
                self.seq += 1
                for node in NODES:
                    if node not in self.job.silent:
                        self.core.report(node, self.job.report(node, self.seq))
            self.core.tick()

    def hangs(self) -> list[Incident]:
        return [i for i in self.core.detection.correlator.incidents(active_only=False) if i.kind == "job_hang"]


@pytest.fixture
def cluster(tmp_path: Path) -> Cluster:
    c = Cluster(tmp_path)
    c.run(60)  # a minute of healthy training: the job's median step time is known
    assert c.hangs() == []
    return c


def test_every_rank_stops_and_the_rank_behind_is_named_within_seconds_of_the_bound(cluster: Cluster) -> None:
    job = cluster.job
    job.pace[5] = 0.0  # rank 5 stops first: its peers finish two more steps and wait for it
    cluster.run(2)
    for rank in job.step:
        job.pace[rank] = 0.0
    top = int(max(job.step.values()))
    stopped_ms = cluster.clock.time_ms()
    cluster.run(60)
    [incident] = cluster.hangs()
    assert incident.active and incident.root_cause == "job:llm" and incident.component_type == "job"
    evidence = incident.evidence[0]["evidence"]
    assert cluster.core.hangs.active()[0].evidence["shape"] == "stalled"
    assert evidence["suspects"] == [{"rank": 5, "node": "node-002", "step": top - 2}]
    assert evidence["bound_s"] == 20.0 and evidence["median_step_s"] == 1.0
    assert sorted(incident.affected_nodes) == NODES
    # bound + one hang check + one report interval + the node-local grouping window
    assert incident.opened_ms - stopped_ms <= (20 + 5 + REPORT_S + 1) * 1000


def test_every_rank_waiting_at_the_same_step_is_a_hang_that_names_nobody(cluster: Cluster) -> None:
    top = int(max(cluster.job.step.values()))
    for rank in cluster.job.step:
        cluster.job.pace[rank] = 0.0
        cluster.job.step[rank] = float(top)
    cluster.run(40)
    [incident] = cluster.hangs()
    evidence = incident.evidence[0]["evidence"]
    assert evidence["suspects"] == [] and evidence["suspect_nodes"] == []
    assert "no rank named" in incident.evidence[0]["message"]


def test_a_hang_resolves_when_the_job_moves_again(cluster: Cluster) -> None:
    paces = dict(cluster.job.pace)
    for rank in cluster.job.step:
        cluster.job.pace[rank] = 0.0
    cluster.run(40)
    assert [i.active for i in cluster.hangs()] == [True]
    cluster.job.pace.update(paces)
    cluster.run(90)  # moving again; the incident resolves after the correlator's resolve hold
    assert [i.active for i in cluster.hangs()] == [False]


def test_one_rank_stopped_while_the_others_move_is_a_divergence_naming_it(cluster: Cluster) -> None:
    cluster.job.pace[6] = 0.0
    cluster.run(40)
    [incident] = cluster.hangs()
    evidence = incident.evidence[0]["evidence"]
    assert evidence["shape"] == "diverged"
    assert [s["rank"] for s in evidence["suspects"]] == [6] and evidence["suspect_nodes"] == ["node-003"]


def test_a_long_checkpoint_within_its_bound_is_not_a_hang(cluster: Cluster) -> None:
    cluster.job.set_phase("checkpointing")
    cluster.run(600)  # ten minutes writing a checkpoint: far past the training bound, within 900 s
    shown = cluster.core.jobs.job("llm")
    assert shown is not None  # what /api/jobs shows: the phase, and how long since the last step
    assert shown.to_dict()["phase"] == "checkpointing" and 595 <= shown.to_dict()["since_step_s"] <= 605  # type: ignore[operator]
    cluster.job.set_phase("training")
    cluster.run(60)
    assert cluster.hangs() == []


def test_a_checkpoint_past_its_own_bound_is_a_hang(tmp_path: Path) -> None:
    c = Cluster(tmp_path, HangConfig(checkpointing_s=120.0))
    c.run(60)
    c.job.set_phase("checkpointing")
    c.run(150)
    [incident] = c.hangs()
    assert incident.evidence[0]["evidence"]["phase"] == "checkpointing"
    assert incident.evidence[0]["evidence"]["bound_s"] == 120.0


def test_one_rank_checkpointing_while_its_peers_wait_on_it_is_not_a_hang(cluster: Cluster) -> None:
    # Rank 0 writes the checkpoint; the others wait for it in a barrier, still "training".
    cluster.job.set_phase("checkpointing", [0])
    for rank in cluster.job.step:
        cluster.job.pace[rank] = 0.0
    cluster.run(300)
    assert cluster.hangs() == []


def test_an_evaluation_pass_within_its_bound_is_not_a_hang(cluster: Cluster) -> None:
    cluster.job.set_phase("evaluating")
    cluster.run(900)
    cluster.job.set_phase("training")
    cluster.run(60)
    assert cluster.hangs() == []


def test_agents_that_restart_lose_the_signal_not_the_progress(cluster: Cluster) -> None:
    # Every agent of the job goes away for two minutes (an upgrade across the fleet): no report
    # lists any rank, the registry's last steps stand still far past the bound. Then the agents
    # are back and list nothing until the ranks reconnect, then the ranks at their new steps.
    cluster.job.silent = set(NODES)
    cluster.run(120)
    cluster.job.silent = set()
    cluster.job.unlisted = set(NODES)
    cluster.run(10)
    cluster.job.unlisted = set()
    cluster.run(60)
    assert cluster.hangs() == []


def test_one_agent_restarting_is_not_a_divergence(cluster: Cluster) -> None:
    cluster.job.silent = {"node-001"}
    cluster.run(90)
    cluster.job.silent = set()
    cluster.run(60)
    assert cluster.hangs() == []


def test_a_straggler_moves_slowly_and_is_not_a_hang(cluster: Cluster) -> None:
    cluster.job.pace[3] = 0.4  # 2.5 s per step: slow, never stopped
    cluster.run(300)
    assert cluster.hangs() == []


def test_a_job_that_never_took_a_step_gets_the_starting_bound(tmp_path: Path) -> None:
    c = Cluster(tmp_path, HangConfig(starting_s=120.0))
    c.job.set_phase("starting")
    c.run(100)
    assert c.hangs() == []
    c.run(40)
    [incident] = c.hangs()
    assert incident.evidence[0]["evidence"]["phase"] == "starting"


def test_settings_refuse_a_floor_above_the_cap() -> None:
    with pytest.raises(ValueError, match="floor_s"):
        HangConfig(floor_s=400.0, cap_s=300.0)


def test_thirty_minutes_of_healthy_training_open_no_hang(cluster: Cluster) -> None:
    """The false-hang figure (bench/README): a checkpoint every 5 min (90 s each), an evaluation
    pass every 10 min (3 min), a straggler at 40 % pace, one agent restart (60 s); 30 min, 0 hangs."""
    cluster.job.pace[2] = 0.4

    def phase_at(t: int) -> str:
        m = t % 600
        if 60 <= m < 150 or 360 <= m < 450:
            return "checkpointing"
        return "evaluating" if 180 <= m < 360 else "training"

    def timeline(t: int) -> None:
        phase = phase_at(t)
        if phase != cluster.job.phase[0]:
            cluster.job.set_phase(phase)
        cluster.job.silent = {"node-001"} if 1000 <= t < 1060 else set()

    cluster.run(1800, during=timeline)
    assert cluster.hangs() == []
    assert max(cluster.job.step.values()) > 500  # it trained in between
