"""The delay vote judged against the fabric's own round-trip baseline (issue 29).

A large fabric whose every path's p99 sits above the absolute threshold (500 us, R-Pingmesh's
SLA) is slow everywhere, not faulty somewhere: no component is named. One cable adding delay
on such a fabric still stands out of the baseline and is named. The real decision core on a
fake clock, each node's results drawn from its pushed plan by the simulated data plane.
"""

from __future__ import annotations

import random
from pathlib import Path

from agent.sim.probe_fabric import SimProbeFabric
from controller.detect.probe_background import delay_baseline
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core.clock import FakeClock
from starpulse.v1 import telemetry_pb2 as tpb
from tests.support.probe_core import hello, probe_core

THRESHOLD_US = ProbeConfig().rtt_threshold_us


class SlowFabric:
    """32 nodes whose every round trip is 600-900 us: a fabric slower than the threshold everywhere."""

    def __init__(self, tmp_path: Path, *, base_us: float = 600.0, spread_us: float = 300.0) -> None:
        self.fabric = generate_fabric(32, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
        self.clock = FakeClock()
        self.core = probe_core(tmp_path, self.fabric, self.clock)
        for node in self.fabric.nodes():
            hello(self.core, node)
        self.sim = SimProbeFabric(
            self.fabric.leaf_of, self.fabric.spines_of, traced=True, base_rtt_us=base_us, spread_us=spread_us
        )
        self.rng = random.Random(11)
        self.seq = 0
        self.t = 0

    def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.clock.advance(1.0)
            self.t += 1
            if self.t % 5 == 0:
                self.seq += 1
                for node in self.fabric.nodes():
                    plan = self.core.registry.nodes[node].probe_plan
                    if plan is None:
                        continue
                    report = tpb.Report(seq=self.seq, timestamp_ms=self.clock.time_ms())
                    report.probe_results.extend(self.sim.window_results(plan, self.rng))
                    self.core.report(node, report)
            self.core.tick()

    def incidents(self) -> list[tuple[str, str]]:
        return [(i.kind, i.root_cause) for i in self.core.open_incidents()]


def test_a_fabric_slow_everywhere_names_no_component(tmp_path: Path) -> None:
    fab = SlowFabric(tmp_path)
    fab.run(150)
    probes = fab.core.detection.probes
    assert probes is not None
    assert probes.delay_baseline is not None and probes.delay_baseline.median_us > THRESHOLD_US  # it is slow
    assert probes.delay_baseline.cut_us > probes.delay_baseline.median_us
    assert fab.incidents() == []
    assert [b for b in probes.last_blames if b.what == "delay"] == []


def test_one_cable_adding_delay_on_a_slow_fabric_is_still_named(tmp_path: Path) -> None:
    fab = SlowFabric(tmp_path)
    fab.run(40)
    cable = fab.fabric.link_name("leaf-b1-r0", "spine-2")
    fab.sim.inject_delay(cable, 0.002)
    fab.run(40)
    assert fab.incidents() == [("link_fault", cable)]


def test_the_baseline_keeps_the_threshold_on_a_fast_fabric_and_is_not_moved_by_a_few_slow_paths() -> None:
    fast = [8.0 + i % 5 for i in range(1000)] + [2500.0] * 20  # a fast fabric, one slow cable's paths
    b = delay_baseline(fast, THRESHOLD_US)
    assert b.cut_us == THRESHOLD_US and b.median_us < 20
    slow = [600.0 + (i * 37) % 300 for i in range(1000)]  # every path 600-900 us
    b = delay_baseline([*slow, *([2600.0] * 20)], THRESHOLD_US)
    assert 900.0 < b.cut_us < 2600.0  # the fabric's own spread is under it, one bad cable's paths over it
    assert delay_baseline([], THRESHOLD_US).cut_us == THRESHOLD_US
