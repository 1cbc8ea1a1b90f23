"""A controller restart is not a prober restart (issue 29): the mesh is not blind after one.

Every agent reconnects to a restarted controller (or a new leader), but no prober restarted:
their results count at once, so a fault already present is named within the mesh's usual
detection time after the restart, not one localisation window later. An agent that did
restart (a new process, a new start stamp in its stream generation) still has its paths left
out for one window: the probes its peers lost to its restart are not a network fault.
The real decision core on a fake clock, restarted on its own SQLite file.
"""

from __future__ import annotations

import random
from pathlib import Path

from agent.sim.probe_fabric import SimProbeFabric
from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.ingest.registry import prober_since
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

LEAF = "leaf-b1-r0"
PROBES = ProbeConfig(enabled=True, window_s=5, replan_min_s=0)  # 30 s localisation window, 2 in a row


class Fleet:
    """Agents that outlive their controller: each keeps its start stamp and its last plan."""

    def __init__(self, tmp_path: Path) -> None:
        self.fabric = generate_fabric(32, gpus_per_node=2, rails=2, nodes_per_block=8, spines=4)
        self.clock = FakeClock()
        self.db = tmp_path / "c.db"
        self.sim = SimProbeFabric(self.fabric.leaf_of, self.fabric.spines_of, traced=True)
        self.rng = random.Random(7)
        self.seq = 0
        self.t = 0  # seconds run
        self.silent: set[str] = set()
        self.started_ms = dict.fromkeys(self.fabric.nodes(), self.clock.time_ms() - 1000)
        self.streams = dict.fromkeys(self.fabric.nodes(), 0)
        self.plans: dict[str, spb.ProbePlan] = {}
        self.store = Store(self.db)
        self.core = self._core()
        for node in self.fabric.nodes():
            self.hello(node)

    def _core(self) -> DecisionCore:
        config = ControllerConfig(
            db_path=self.db,
            fabric=self.fabric,
            heartbeat_timeout_s=3600.0,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0), probes=PROBES),
        )
        return DecisionCore(config, self.clock, self.store, ControllerMetrics(), fabric=self.fabric)

    def hello(self, node: str) -> None:
        """The agent's Hello as agent.transport.link sends it: start stamp x 1,000 + its stream tries."""
        self.streams[node] += 1
        nics = [ipb.NicInfo(rdma_device=f"mlx5_{r}", port=1, netdev=f"rail{r}", paired_gpu_index=r) for r in range(2)]
        generation = self.started_ms[node] * 1000 + self.streams[node]
        self.core.hello(
            spb.Hello(
                node_id=node,
                role=ipb.NODE_ROLE_COMPUTE,
                inventory=ipb.Inventory(nics=nics),
                stream_generation=generation,
            )
        )

    def restart_agent(self, node: str) -> None:
        """A new agent process: a new start stamp, its stream tries from zero."""
        self.started_ms[node] = self.clock.time_ms()
        self.streams[node] = 0

    def restart_controller(self) -> None:
        """The controller process ends and a new one starts on the same database; every agent reconnects."""
        self.store.close()
        self.store = Store(self.db)
        self.core = self._core()
        for node in self.fabric.nodes():
            if node not in self.silent:
                self.hello(node)

    def run(self, seconds: int) -> None:
        """Every 5 s each node reports one window of its plan (the last one it was given)."""
        for _ in range(seconds):
            self.clock.advance(1.0)
            self.t += 1
            if self.t % 5 == 0:
                self.seq += 1
                for node in self.fabric.nodes():
                    given = self.core.registry.nodes[node].probe_plan
                    if given is not None:
                        self.plans[node] = given
                    plan = self.plans.get(node)
                    if plan is None or node in self.silent:
                        continue
                    report = tpb.Report(seq=self.seq, timestamp_ms=self.clock.time_ms())
                    report.probe_results.extend(self.sim.window_results(plan, self.rng))
                    self.core.report(node, report)
            self.core.tick()

    def until_incident(self, limit_s: int) -> int | None:
        """Seconds until an incident is open (None: none within ``limit_s``)."""
        for t in range(1, limit_s + 1):
            self.run(1)
            if self.core.open_incidents():
                return t
        return None

    def incidents(self) -> list[tuple[str, str]]:
        return [(i.kind, i.root_cause) for i in self.core.open_incidents()]


def test_a_fault_present_across_a_controller_restart_is_named_within_the_usual_detection_time(
    tmp_path: Path,
) -> None:
    steady = Fleet(tmp_path / "steady")
    steady.run(40)
    steady.sim.inject_loss(LEAF, 0.01)
    usual = steady.until_incident(120)
    assert usual is not None and steady.incidents() == [("switch_fault", LEAF)]

    fleet = Fleet(tmp_path / "restart")
    fleet.run(40)
    fleet.sim.inject_loss(LEAF, 0.01)
    fleet.run(5)  # the fault is there; the controller goes before it has named it
    assert fleet.incidents() == []
    fleet.restart_controller()
    after = fleet.until_incident(120)
    assert after is not None and fleet.incidents() == [("switch_fault", LEAF)]
    # Within the usual time from the fault's start (a report interval's phase of slack), not
    # one 30 s localisation window (every node left out as reconnected) plus that time.
    assert after <= usual + 5, (after, usual)
    assert after < PROBES.localise_window_s


def test_an_agent_that_restarted_with_the_controller_is_still_left_out_for_one_window(tmp_path: Path) -> None:
    fleet = Fleet(tmp_path)
    fleet.run(40)
    # node-005's agent dies with the controller: nothing answers its probes for 10 s...
    fleet.sim.inject_loss("node-005", 1.0)
    fleet.silent.add("node-005")
    fleet.run(10)
    fleet.restart_controller()
    fleet.run(5)
    # ...then a new agent process comes back (a new start stamp), while every other merely reconnected.
    fleet.restart_agent("node-005")
    fleet.sim.clear("node-005")
    fleet.silent.discard("node-005")
    fleet.hello("node-005")
    fleet.run(60)
    assert fleet.incidents() == []


def test_prober_since_tells_a_reconnect_from_a_restart() -> None:
    started, now = 1_700_000_000_000, 1_700_000_600_000
    generation = started * 1000 + 3
    # heard from this process before (here, or by the controller before us): since it started
    assert prober_since(generation, heard_ms=started + 5_000, now_ms=now) == started
    # a process never heard from (started after the node was last heard, or a new node): now
    assert prober_since(generation, heard_ms=started - 5_000, now_ms=now) == now
    assert prober_since(generation, heard_ms=-1, now_ms=now) == now
    # an agent older than start-stamped generations (a plain count): now
    assert prober_since(3, heard_ms=now - 1_000, now_ms=now) == now
