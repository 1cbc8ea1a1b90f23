"""The probe mesh's periodic step: O(1) between changes, planned off the loop, stale plans dropped (issue 29)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import pytest

import controller.mesh as mesh_module
from controller.fabric import Fabric, generate_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.ingest.registry import NodeRegistry
from controller.mesh import ProbeMesh
from controller.metrics import ControllerMetrics
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb

REPLAN_S = 30.0


class _CountingNodes(dict[str, Any]):
    """The registry's node table, counting the walks over it."""

    walks = 0

    def items(self) -> Any:
        self.walks += 1
        return super().items()


class _Fleet:
    """A 32-node fabric, every node online in a real registry, and a mesh over them."""

    def __init__(self, tmp_path: Path, where: str = "always", offload: bool = True) -> None:
        """``offload``: as the controller's sweep loop sets it (a harness stepping ticks leaves it off)."""
        self.clock = FakeClock(1_000_000)
        self.fabric: Fabric = generate_fabric(32, nodes_per_block=16, spines=2)
        self.store = Store(tmp_path / "c.db")
        self.registry = NodeRegistry(self.store, ControllerMetrics(), heartbeat_timeout_s=60, clock=self.clock)
        for node in self.fabric.nodes():
            self.registry.register(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
        self.nodes = _CountingNodes(self.registry.nodes)
        self.registry.nodes = self.nodes
        self.busy: set[str] = set()
        self.busy_reads = 0
        config = ProbeConfig(enabled=True, where=where, replan_min_s=REPLAN_S)  # type: ignore[arg-type]
        self.mesh = ProbeMesh(
            self.fabric, config, self.registry, busy_nodes=self._busy_nodes, clock=self.clock, offload=offload
        )

    def _busy_nodes(self) -> set[str]:
        self.busy_reads += 1
        return set(self.busy)

    def pushed_versions(self) -> set[int | None]:
        return {rec.probe_plan.version if rec.probe_plan is not None else None for rec in self.registry.nodes.values()}


def test_a_node_seen_for_the_first_time_gets_a_plan_without_a_presence_change(tmp_path: Path) -> None:
    """A first Hello registers the node online: no presence change is told, and it must still be planned."""
    fleet = _Fleet(tmp_path)
    late = sorted(fleet.fabric.nodes())[-1]
    del fleet.nodes[late]  # not connected yet when the first plan is made
    assert fleet.mesh.tick()
    first = fleet.mesh.plan
    assert first is not None and late not in first.targets
    fleet.registry.register(spb.Hello(node_id=late, role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
    assert not fleet.mesh.tick()  # within replan_min_s of the last plan: not yet
    fleet.clock.advance(REPLAN_S)
    assert fleet.mesh.tick()
    plan = fleet.mesh.plan
    assert plan is not None and plan.version > first.version and late in plan.targets
    assert fleet.registry.nodes[late].probe_plan is not None
    fleet.store.close()


def test_unchanged_inputs_neither_walk_the_fleet_nor_replan(tmp_path: Path) -> None:
    fleet = _Fleet(tmp_path)
    assert fleet.mesh.tick()  # no loop running: planned in the caller
    first = fleet.mesh.plan
    assert first is not None and fleet.pushed_versions() == {first.version}
    walks = fleet.nodes.walks
    for _ in range(20):
        fleet.clock.advance(REPLAN_S)
        assert not fleet.mesh.tick()
    assert fleet.nodes.walks == walks  # nothing said the fleet changed: no walk of the registry
    assert fleet.mesh.plan is first

    fleet.mesh.changed()  # a node came or went
    assert fleet.mesh.tick()
    assert fleet.nodes.walks == walks + 1
    assert fleet.mesh.plan is not None and fleet.mesh.plan.version > first.version
    fleet.store.close()


def test_jobs_are_read_at_most_once_per_replan_interval_and_a_new_job_replans(tmp_path: Path) -> None:
    fleet = _Fleet(tmp_path, where="thin_on_jobs")
    assert fleet.mesh.tick()
    first = fleet.mesh.plan
    assert first is not None and fleet.busy_reads == 1
    fleet.clock.advance(REPLAN_S)
    for _ in range(10):
        assert not fleet.mesh.tick()  # jobs unchanged: read once, no plan
    assert fleet.busy_reads == 2 and fleet.mesh.plan is first

    node = fleet.fabric.nodes()[0]
    fleet.busy.add(node)  # a job starts: no hook tells the mesh, the next reading finds it
    fleet.clock.advance(REPLAN_S / 2)
    assert not fleet.mesh.tick() and fleet.busy_reads == 2
    fleet.clock.advance(REPLAN_S / 2)
    assert fleet.mesh.tick()
    plan = fleet.mesh.plan
    assert plan is not None and plan.version > first.version
    thinned = {t.packets_per_s for t in plan.targets[node]}
    full = {t.packets_per_s for t in first.targets[node]}
    assert max(thinned) < max(full)  # the job's node probes at a quarter of the budget
    fleet.store.close()


async def test_a_plan_is_computed_off_the_loop_and_applied_on_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fleet = _Fleet(tmp_path)
    threads: list[int] = []
    real = mesh_module.plan_mesh

    def recording(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.get_ident())
        return real(*args, **kwargs)

    monkeypatch.setattr(mesh_module, "plan_mesh", recording)
    assert fleet.mesh.tick()
    in_flight = fleet.mesh.in_flight
    assert in_flight is not None
    assert fleet.mesh.plan is None and fleet.pushed_versions() == {None}  # nothing applied before it lands
    fleet.mesh.changed()
    assert not fleet.mesh.tick()  # one plan at a time
    await in_flight
    await asyncio.sleep(0)
    assert threads and threads[0] != threading.get_ident()
    plan = fleet.mesh.plan
    assert plan is not None and fleet.pushed_versions() == {plan.version}
    assert fleet.mesh.in_flight is None
    assert not fleet.mesh.tick()  # the change made while it was in flight waits for the interval
    fleet.clock.advance(REPLAN_S)
    assert fleet.mesh.tick()  # and is not forgotten
    await fleet.mesh.in_flight  # type: ignore[misc]
    fleet.store.close()


async def test_a_plan_over_wiring_that_moved_meanwhile_is_dropped_and_made_again(tmp_path: Path) -> None:
    fleet = _Fleet(tmp_path)
    nic = fleet.fabric.nics_of(fleet.fabric.nodes()[0])[0]
    old_leaf = fleet.fabric.leaf_of(nic)
    new_leaf = next(leaf for leaf in fleet.fabric.leaves() if leaf != old_leaf)
    assert fleet.mesh.tick()
    in_flight = fleet.mesh.in_flight
    assert in_flight is not None
    assert fleet.fabric.rewire_nic(nic, new_leaf, "p-learned") is not None  # LLDP moved a cable
    fleet.mesh.changed()
    await asyncio.gather(in_flight, return_exceptions=True)
    await asyncio.sleep(0)
    assert fleet.mesh.plan is None and fleet.mesh.dropped == 1
    assert fleet.pushed_versions() == {None}  # nothing planned over the old wiring went out

    assert fleet.mesh.tick()
    await fleet.mesh.in_flight  # type: ignore[misc]
    await asyncio.sleep(0)
    plan = fleet.mesh.plan
    assert plan is not None and fleet.pushed_versions() == {plan.version}
    leaf_ring = {t.peer_nic for ts in plan.targets.values() for t in ts if t.purpose == "leaf" and t.local_nic == nic}
    assert leaf_ring and leaf_ring <= set(fleet.fabric.nics_on_leaf(new_leaf))  # planned over the new cable
    fleet.store.close()


async def test_a_newer_plan_supersedes_the_one_in_flight(tmp_path: Path) -> None:
    fleet = _Fleet(tmp_path)
    assert fleet.mesh.tick()
    in_flight = fleet.mesh.in_flight
    assert in_flight is not None
    fleet.clock.advance(1)
    newer = fleet.mesh.replan()  # planned in the caller while the older one computes
    await in_flight
    await asyncio.sleep(0)
    assert fleet.mesh.plan is newer and fleet.mesh.dropped == 1
    assert fleet.pushed_versions() == {newer.version}
    fleet.store.close()


async def test_a_harness_stepping_ticks_gets_its_plan_before_the_clock_moves(tmp_path: Path) -> None:
    """Off-loop planning is the sweep loop's: a fake-clock harness (bench.probe_mesh) reads plans right after."""
    fleet = _Fleet(tmp_path, offload=False)
    assert fleet.mesh.tick()
    plan = fleet.mesh.plan
    assert fleet.mesh.in_flight is None and plan is not None
    assert fleet.pushed_versions() == {plan.version}
    fleet.store.close()
