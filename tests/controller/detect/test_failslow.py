"""Fail-slow detection: robust peer comparison flags a node persistently slower than its group."""

from __future__ import annotations

import random

import pytest

from controller.detect.failslow import FailSlowConfig, FailSlowDetector
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb

NODES = [f"node-{i:03d}" for i in range(16)]
BASE_CLOCK = 1980.0
BASE_POWER = 650.0
BASE_UTIL = 95.0
BASE_GBPS = 400.0  # per node, tx + rx
INTERVAL_S = 5


class Cluster:
    """Sixteen simulated nodes producing reports; per-node speed factors and noise."""

    def __init__(self, clock: FakeClock, noise: float = 0.0, seed: int = 1, step_time: bool = False) -> None:
        self.clock = clock
        self.noise = noise
        self.rng = random.Random(seed)
        self.step_time = step_time
        self.factor = dict.fromkeys(NODES, 1.0)
        self.words = dict.fromkeys(NODES, 0)

    def _n(self, value: float) -> float:
        return value * (1 + self.rng.gauss(0, self.noise)) if self.noise else value

    def report(self, node: str) -> tpb.Report:
        f = self.factor[node]
        r = tpb.Report(seq=1, timestamp_ms=self.clock.time_ms())
        for g in range(8):
            r.gpus.add(
                index=g,
                sm_clock_mhz=int(self._n(BASE_CLOCK * f)),
                power_w=self._n(BASE_POWER * f),
                utilization_gpu_pct=min(100.0, self._n(BASE_UTIL * f)),
            )
        # bytes over the interval at BASE_GBPS * f, split over 8 NICs, counted in 4-byte words
        words = int(self._n(BASE_GBPS * f) * 1e9 / 8 * INTERVAL_S / 4)
        self.words[node] += words
        for k in range(8):
            nic = r.nics.add(rdma_device=f"mlx5_{k}", port=1)
            nic.counters["port_xmit_data"] = self.words[node] // 16
            nic.counters["port_rcv_data"] = self.words[node] // 16
        if self.step_time:
            for rank in range(8):
                r.job_steps.add(job="llama", rank=rank, step=1, step_time_s=self._n(2.0 / f))
        return r

    def run(self, det: FailSlowDetector, rounds: int) -> list:
        changes = []
        for _ in range(rounds):
            self.clock.advance(INTERVAL_S)
            for n in NODES:
                det.observe(n, self.report(n))
            changes += det.evaluate()
        return changes


def block_of(node: str) -> str:
    return "block-0"


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)


def detector(clock: FakeClock, **cfg: object) -> FailSlowDetector:
    settings: dict[str, object] = {
        "window_s": 60,
        "min_samples": 3,
        "persist_evaluations": 3,
        "sample_every_s": 0,
        **cfg,
    }
    config = FailSlowConfig(**settings)  # type: ignore[arg-type]
    return FailSlowDetector(config, group_of=block_of, clock=clock)


class TestFailSlowDetector:
    def test_node_at_reduced_clock_is_flagged(self, clock):
        """One node running at 0.7x among 16 is flagged as failslow with its peer statistics as evidence."""
        cluster = Cluster(clock)
        cluster.factor["node-007"] = 0.7
        det = detector(clock, signals=("sm_clock_mhz",))
        changes = cluster.run(det, 6)
        assert [(c.kind, c.condition.component) for c in changes] == [("opened", "node-007")]
        cond = changes[0].condition
        assert (cond.rule, cond.category, cond.component_type) == ("failslow", "failslow", "node")
        assert cond.node == "node-007"
        assert (cond.severity, cond.action) == ("warning", "investigate")
        ev = cond.evidence
        assert ev["signal"] == "sm_clock_mhz"
        assert ev["value"] == pytest.approx(0.7 * BASE_CLOCK, rel=0.01)
        assert ev["group_median"] == pytest.approx(BASE_CLOCK, rel=0.01)
        assert ev["group"] == "block-0" and ev["peers"] == 15
        assert ev["relative_deviation"] == pytest.approx(0.3, abs=0.01)

    def test_flag_needs_persistence_and_clears_with_hysteresis(self, clock):
        """A node is flagged only after persist_evaluations hits and resolves after as many clean ones."""
        cluster = Cluster(clock)
        cluster.factor["node-003"] = 0.6
        det = detector(clock, signals=("power_w",), min_samples=1)
        assert cluster.run(det, 2) == []
        opened = cluster.run(det, 1)
        assert [c.kind for c in opened] == ["opened"]
        cluster.factor["node-003"] = 1.0
        det.config.window_s = 4  # shorter than a report interval: only the latest sample counts
        assert cluster.run(det, 2) == []
        resolved = cluster.run(det, 1)
        assert [(c.kind, c.condition.component) for c in resolved] == [("resolved", "node-003")]
        assert resolved[0].condition.resolved_ms == clock.time_ms()

    def test_uniformly_slow_group_flags_nobody(self, clock):
        """Every node at 0.7x is a slow job, not a straggler: nobody is flagged."""
        cluster = Cluster(clock)
        for n in NODES:
            cluster.factor[n] = 0.7
        det = detector(clock)
        assert cluster.run(det, 10) == []

    def test_noisy_healthy_group_flags_nobody(self, clock):
        """Five percent per-sample noise on every signal of a healthy group flags nobody."""
        cluster = Cluster(clock, noise=0.05, seed=42, step_time=True)
        det = detector(clock)
        assert cluster.run(det, 30) == []
        assert det.active() == []

    def test_step_time_straggler_grouped_by_job(self, clock):
        """A node whose ranks report 1.5x step time is flagged within its job even with no fallback group."""
        cluster = Cluster(clock, step_time=True)
        cluster.factor["node-011"] = 1 / 1.5
        det = FailSlowDetector(
            FailSlowConfig(
                window_s=60, min_samples=3, persist_evaluations=3, signals=("step_time_s",), sample_every_s=0
            ),
            group_of=lambda n: None,
            clock=clock,
        )
        changes = cluster.run(det, 5)
        assert [(c.kind, c.condition.component) for c in changes] == [("opened", "node-011")]
        ev = changes[0].condition.evidence
        assert (ev["signal"], ev["group"]) == ("step_time_s", "job:llama")
        assert ev["value"] == pytest.approx(3.0)

    def test_nic_throughput_from_word_counters(self, clock):
        """NIC Gb/s comes from port_xmit_data + port_rcv_data deltas in 4-byte words; a half-rate node is flagged."""
        cluster = Cluster(clock)
        cluster.factor["node-001"] = 0.5
        det = detector(clock, signals=("nic_gbps",))
        changes = cluster.run(det, 6)
        assert [c.condition.component for c in changes] == ["node-001"]
        ev = changes[0].condition.evidence
        assert ev["group_median"] == pytest.approx(BASE_GBPS, rel=0.01)
        assert ev["value"] == pytest.approx(BASE_GBPS / 2, rel=0.01)

    def test_signals_sampled_once_per_period_with_nic_rate_over_the_span(self, clock):
        """Reports every 5 s, sample_every_s 15: one in three lands in the window, and its NIC Gb/s
        is the counters' rate since the last sample. A full report between samples still sets the
        base that later delta reports' absent counters equal."""
        det = detector(clock, signals=("nic_gbps", "power_w"), sample_every_s=15)
        words_per_s = 400e9 / 8 / 4 / 2  # tx and rx each carry half of 400 Gb/s, in 4-byte words

        def report(t: int, words: int | None, delta: bool = False) -> tpb.Report:
            r = tpb.Report(seq=1, timestamp_ms=clock.time_ms(), counters_delta=delta)
            r.gpus.add(index=0, power_w=600.0 + t)
            nic = r.nics.add(rdma_device="mlx5_0", port=1)
            if words is not None:
                nic.counters["port_xmit_data"] = nic.counters["port_rcv_data"] = words
            return r

        taken = []
        for t in range(0, 35, 5):
            # t=5: full, not sampled (its traffic is the base); t=10..30: deltas without traffic
            # counters, i.e. the port is idle since t=5
            words = int(words_per_s * min(t, 5))
            det.observe("node-001", report(t, None if t >= 10 else words, delta=t >= 10))
            taken.append(len(det._nodes["node-001"].series["power_w"]))
            clock.advance(5)
        assert taken == [1, 1, 1, 2, 2, 2, 3]  # t = 0, 15, 30
        nic = [v for _, v in det._nodes["node-001"].series["nic_gbps"]]
        # t=0: no earlier sample; t=15: 5 s at 400 Gb/s over 15 s; t=30: idle
        assert nic == [pytest.approx(400 * 5 / 15), 0.0]

    def test_small_group_flags_nobody(self, clock):
        """A group below min_group_size is not compared at all."""
        cluster = Cluster(clock)
        cluster.factor["node-000"] = 0.5
        det = FailSlowDetector(
            FailSlowConfig(window_s=60, min_samples=3, persist_evaluations=1),
            group_of=lambda n: "tiny" if n in NODES[:3] else None,
            clock=clock,
        )
        assert cluster.run(det, 5) == []

    def test_forget_resolves_open_condition(self, clock):
        """Forgetting a flagged node resolves its condition and drops its state."""
        cluster = Cluster(clock)
        cluster.factor["node-005"] = 0.5
        det = detector(clock)
        cluster.run(det, 6)
        assert [c.component for c in det.active()] == ["node-005"]
        change = det.forget("node-005")
        assert change is not None and change.kind == "resolved"
        assert det.active() == []
        assert det.forget("node-005") is None

    def test_config_rejects_unknown_signal(self):
        """A misspelt signal name fails at configuration time, not silently at evaluation."""
        with pytest.raises(ValueError, match="unknown fail-slow signals"):
            FailSlowConfig(signals=("sm_clock",))


def test_window_median_is_statistics_median_as_samples_come_and_go() -> None:
    """The sorted copy a window keeps gives exactly what statistics.median of its samples gives."""
    import random
    import statistics

    from controller.detect.failslow import _Window

    rng = random.Random(7)
    window = _Window()
    for t in range(2_000):
        window.append((t, rng.choice([rng.random() * 100, 42.0, 42.0, -3.5])))  # repeats too
        if t % 3 == 0:
            window.prune(t - rng.randint(5, 60))
        values = list(window.values)
        assert window.median() == statistics.median(values)
        assert window.ordered == sorted(values)
        assert window[-1] == (t, values[-1])


def test_stepwise_evaluation_pauses_and_reaches_the_same_verdicts() -> None:
    """evaluation_steps pauses between groups of nodes and ends where evaluate ends; a node
    forgotten during a pause gets no condition."""
    clock = FakeClock(1_000_000)

    def build() -> FailSlowDetector:
        return FailSlowDetector(
            FailSlowConfig(persist_evaluations=1), group_of=lambda n: f"g{int(n[1:]) // 8}", clock=clock
        )

    whole, stepwise = build(), build()
    for _ in range(6):
        clock.advance(5)
        for i in range(64):  # 8 groups of 8; the first node of each group is slow
            values = {"sm_clock_mhz": 1980.0 * (0.5 if i % 8 == 0 else 1.0) + i % 3}
            whole.append(f"n{i}", values)
            stepwise.append(f"n{i}", values)
    expected = whole.evaluate()
    changes: list = []
    pauses = sum(1 for _ in stepwise.evaluation_steps(changes, nodes_per_step=16))
    assert pauses == 4  # after grouping, then after every 2 groups of 8 but not after the last
    assert [(c.kind, c.condition.node) for c in changes] == [(c.kind, c.condition.node) for c in expected]
    assert {c.condition.node for c in changes} == {f"n{i}" for i in range(0, 64, 8)}

    again: list = []
    steps = build()
    for _ in range(6):
        clock.advance(5)
        for i in range(64):
            steps.append(f"n{i}", {"sm_clock_mhz": 1980.0 * (0.5 if i % 8 == 0 else 1.0) + i % 3})
    running = steps.evaluation_steps(again, nodes_per_step=16)
    next(running)
    steps.forget("n56")  # its group (the last) has not been compared yet
    for _ in running:
        pass
    assert "n56" not in {c.condition.node for c in again}
    assert len(again) == 7


def _jittered_run(seed: int, slow_nodes: list[str], factor: float) -> list:
    """Sixteen nodes of one job on a loaded machine: each reports every 5 s give or take 2 s, at
    its own phase; at t = 600 s ``slow_nodes`` slow to ``factor`` at once. Default settings,
    evaluations every 5 s. Returns the conditions opened."""
    clock = FakeClock(1_000_000)
    cluster = Cluster(clock, noise=0.01, seed=seed, step_time=True)
    det = FailSlowDetector(FailSlowConfig(), group_of=block_of, clock=clock)
    rng = random.Random(seed)
    due = {n: rng.uniform(0, 5) for n in NODES}
    last = dict.fromkeys(NODES, 0.0)
    words = dict.fromkeys(NODES, 0)
    t = evaluated = 0.0
    opened = []
    while t < 1500:
        node = min(due, key=due.__getitem__)
        while evaluated + 5 <= due[node]:
            evaluated += 5
            clock.advance(evaluated - t)
            t = evaluated
            opened += [c.condition for c in det.evaluate() if c.kind == "opened"]
        clock.advance(due[node] - t)
        t = due[node]
        if t > 600:
            for n in slow_nodes:
                cluster.factor[n] = factor
        report = cluster.report(node)
        # NIC words for the time that really passed since this node's last report, not a nominal 5 s
        words[node] += int(BASE_GBPS * cluster.factor[node] * 1e9 / 8 * (t - last[node]) / 4)
        for nic in report.nics:
            nic.counters["port_xmit_data"] = nic.counters["port_rcv_data"] = words[node] // 16
        last[node] = t
        det.observe(node, report)
        due[node] = t + 5 + rng.uniform(-2, 2)
    return opened


@pytest.mark.parametrize("seed", range(6))
def test_a_whole_job_slowing_alike_flags_nobody_on_a_loaded_machine(seed: int) -> None:
    """Every node slows at once: each node's window median turns when half its samples are slow,
    and jittered reports make some turn before their peers. The node's latest samples equal its
    peers' latest (FailSlowConfig.recent_samples), so nobody is a straggler and nobody is evicted."""
    assert _jittered_run(seed, NODES, 0.6) == []


@pytest.mark.parametrize("seed", range(2))
def test_a_lone_straggler_is_still_flagged_on_a_loaded_machine(seed: int) -> None:
    opened = _jittered_run(seed, ["node-009"], 0.6)
    assert {c.component for c in opened} == {"node-009"}
