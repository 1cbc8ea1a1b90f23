"""The probe mesh's plan, kept current: planned from the fabric, pushed to each node's stream.

Replans when the fleet changes (a node comes or goes), when learned wiring changes the
fabric, or when a job's nodes change and the operator pauses or thins probing on them; at
most once per ``replan_min_s``, since a fleet coming up changes on every Hello. Versions are
the controller's clock in milliseconds, so a new leader's plan supersedes its predecessor's.

A plan at 2,000 nodes takes ~1 s of Python (``plan_mesh`` and every node's message), so in
the controller's sweep loop it is computed in a worker thread from a snapshot of its inputs
and applied on the loop when it lands (bench.scale's ``probe_mesh`` periodic step held the loop
60-480 ms mean, 2.5 s at most, at 2,000-4,000 nodes). Between plans a tick costs O(1): the
fleet and the fabric say when they change (``changed``); jobs have no such hook, so with
``where`` other than ``always`` their nodes are read again at most once per ``replan_min_s``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass

import structlog

from controller.fabric import Fabric
from controller.fabric.probeplan import MeshPlan, ProbeConfig, plan_mesh
from controller.ingest.registry import ONLINE, NodeRegistry
from starpulse.core.clock import Clock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb

log = structlog.get_logger(__name__)

Inputs = tuple[frozenset[str], frozenset[str]]  # (online compute nodes in the fabric, those running a job)


@dataclass(frozen=True)
class _Computed:
    """A plan and every planned node's message, built off the loop."""

    plan: MeshPlan
    wires: dict[str, spb.ProbePlan]
    inputs: Inputs
    fabric_generation: int
    seconds: float


class ProbeMesh:
    """Plans and pushes; ``changed`` marks the plan stale, ``tick`` replans when due."""

    def __init__(
        self,
        fabric: Fabric,
        config: ProbeConfig,
        registry: NodeRegistry,
        *,
        busy_nodes: Callable[[], Collection[str]],
        clock: Clock,
        on_planned: Callable[[MeshPlan], None] | None = None,
        offload: bool = False,
    ) -> None:
        """``busy_nodes``: the nodes a job runs on, read in one pass (not a question per node).
        ``on_planned``: hears each new plan (the metrics' target count). ``offload``: plan in a
        worker thread when an event loop runs; the controller's own sweep loop turns it on
        (controller.core), a harness stepping ``DecisionCore.tick`` on a fake clock plans in
        the caller, so its plans are there before its clock moves on."""
        self.fabric = fabric
        self.config = config
        self.registry = registry
        self.busy_nodes = busy_nodes
        self.clock = clock
        self.on_planned = on_planned
        self.offload = offload
        self.plan: MeshPlan | None = None
        self.plan_seconds = 0.0
        self.dropped = 0  # plans computed and not applied: the fabric moved, or a newer plan landed first
        self.in_flight: asyncio.Future[_Computed] | None = None
        self._stale = True
        self._last = float("-inf")  # when the last plan was started (monotonic)
        self._checked = float("-inf")  # when the jobs' nodes were last read without a change
        self._inputs: Inputs = (frozenset(), frozenset())
        self._presence_seen = -1  # the registry's presence version the inputs were last read at

    def changed(self) -> None:
        self._stale = True

    def tick(self) -> bool:
        """Start a plan when it is stale (or the jobs' nodes moved) and the last one is old enough."""
        if not self.config.enabled or self.in_flight is not None:
            return False  # one plan at a time: a change meanwhile keeps ``_stale`` for the next
        now = self.clock.monotonic()
        if self.plan is not None and now - self._last < self.config.replan_min_s:
            return False
        if not self._stale:
            # A node seen for the first time is registered online, so no presence change says so:
            # the registry's presence version does (it moves on every Hello).
            moved = self.registry.presence_version != self._presence_seen
            jobs_due = self.config.where != "always" and now - self._checked >= self.config.replan_min_s
            if not moved and not jobs_due:
                return False
            if jobs_due:
                self._checked = now
            inputs = self._current_inputs()
            if inputs == self._inputs:
                return False
        else:
            inputs = self._current_inputs()
        self._start(inputs)
        return True

    def _current_inputs(self) -> Inputs:
        self._presence_seen = self.registry.presence_version
        online = frozenset(
            n
            for n, rec in self.registry.nodes.items()
            if rec.state == ONLINE and rec.role == ipb.NODE_ROLE_COMPUTE and n in self.fabric
        )
        busy = frozenset() if self.config.where == "always" else online.intersection(self.busy_nodes())
        return online, busy

    def _version(self) -> int:
        return max(self.clock.time_ms(), (self.plan.version + 1) if self.plan is not None else 0)

    def _start(self, inputs: Inputs) -> None:
        self._stale, self._last = False, self.clock.monotonic()
        version = self._version()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        generation = self.fabric.generation  # read here: a change from now on drops what the thread plans
        if loop is None or not self.offload:
            self._apply(self._compute(inputs, version, generation))
            return
        future = loop.run_in_executor(None, self._compute, inputs, version, generation)
        self.in_flight = future
        future.add_done_callback(self._landed)

    def _compute(self, inputs: Inputs, version: int, generation: int) -> _Computed:
        """The plan and its messages: reads the fabric and the inputs' snapshot, writes nothing shared."""
        online, busy = inputs
        started = time.perf_counter()
        plan = plan_mesh(self.fabric, self.config, nodes=online, busy=busy.__contains__, version=version)
        wires = {node: plan.for_node(node, self.config) for node in online}
        return _Computed(plan, wires, inputs, generation, time.perf_counter() - started)

    def _landed(self, future: asyncio.Future[_Computed]) -> None:
        """On the loop: apply the plan unless the fabric moved under it or a newer plan came first."""
        self.in_flight = None
        if future.cancelled():
            self._stale = True
            return
        error = future.exception()
        if error is not None:  # a wiring change mid-walk can break the walk itself
            self._stale = True
            self.dropped += 1
            log.warning("probe_mesh_plan_failed", error=repr(error))
            return
        self._apply(future.result())

    def _apply(self, done: _Computed) -> bool:
        if done.fabric_generation != self.fabric.generation:
            self._stale = True  # planned over wiring that has since moved: plan again
            return self._drop(done, "fabric_moved")
        if self.plan is not None and done.plan.version <= self.plan.version:
            return self._drop(done, "superseded")
        for node, wire in done.wires.items():
            self.registry.push_probe_plan(node, wire)
        self.plan_seconds = done.seconds
        if self.on_planned is not None:
            self.on_planned(done.plan)
        self.plan, self._inputs = done.plan, done.inputs
        log.info("probe_mesh_pushed", version=done.plan.version, nodes=len(done.wires), seconds=round(done.seconds, 3))
        return True

    def _drop(self, done: _Computed, why: str) -> bool:
        self.dropped += 1
        log.info("probe_mesh_plan_dropped", version=done.plan.version, why=why)
        return False

    def replan(self) -> MeshPlan:
        """Plan now, in the caller (an operator's or a test's replan): supersedes a plan in flight."""
        inputs = self._current_inputs()
        self._stale, self._last = False, self.clock.monotonic()
        self._apply(self._compute(inputs, self._version(), self.fabric.generation))
        assert self.plan is not None
        return self.plan
