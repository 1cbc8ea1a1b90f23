"""The probe mesh's plan, kept current: planned from the fabric, pushed to each node's stream.

Replans when the fleet changes (a node comes or goes), when learned wiring changes the
fabric, or when a job's nodes change and the operator pauses or thins probing on them; at
most once per ``replan_min_s``, since a fleet coming up changes on every Hello. Versions are
the controller's clock in milliseconds, so a new leader's plan supersedes its predecessor's.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from controller.fabric import Fabric
from controller.fabric.probeplan import MeshPlan, ProbeConfig, plan_mesh
from controller.ingest.registry import ONLINE, NodeRegistry
from starpulse.core.clock import Clock
from starpulse.v1 import inventory_pb2 as ipb

log = structlog.get_logger(__name__)


class ProbeMesh:
    """Plans and pushes; ``changed`` marks the plan stale, ``tick`` replans when due."""

    def __init__(
        self,
        fabric: Fabric,
        config: ProbeConfig,
        registry: NodeRegistry,
        *,
        busy: Callable[[str], bool],
        clock: Clock,
        on_planned: Callable[[MeshPlan], None] | None = None,
    ) -> None:
        """``on_planned``: hears each new plan (the metrics' target count)."""
        self.fabric = fabric
        self.config = config
        self.registry = registry
        self.busy = busy
        self.clock = clock
        self.on_planned = on_planned
        self.plan: MeshPlan | None = None
        self.plan_seconds = 0.0
        self._stale = True
        self._last = float("-inf")
        self._inputs: tuple[frozenset[str], frozenset[str]] = (frozenset(), frozenset())

    def changed(self) -> None:
        self._stale = True

    def tick(self) -> bool:
        """Replan when the plan is stale (or its inputs moved) and the last one is old enough."""
        if not self.config.enabled:
            return False
        now = self.clock.monotonic()
        if now - self._last < self.config.replan_min_s and self.plan is not None:
            return False
        inputs = self._current_inputs()
        if not self._stale and inputs == self._inputs:
            return False
        self.replan(inputs)
        return True

    def _current_inputs(self) -> tuple[frozenset[str], frozenset[str]]:
        online = frozenset(
            n
            for n, rec in self.registry.nodes.items()
            if rec.state == ONLINE and rec.role == ipb.NODE_ROLE_COMPUTE and n in self.fabric
        )
        busy = frozenset() if self.config.where == "always" else frozenset(n for n in online if self.busy(n))
        return online, busy

    def replan(self, inputs: tuple[frozenset[str], frozenset[str]] | None = None) -> MeshPlan:
        online, busy = inputs if inputs is not None else self._current_inputs()
        version = max(self.clock.time_ms(), (self.plan.version + 1) if self.plan is not None else 0)
        started = time.perf_counter()
        plan = plan_mesh(self.fabric, self.config, nodes=online, busy=busy.__contains__, version=version)
        for node in online:
            self.registry.push_probe_plan(node, plan.for_node(node, self.config))
        self.plan_seconds = time.perf_counter() - started
        if self.on_planned is not None:
            self.on_planned(plan)
        self.plan, self._inputs, self._stale, self._last = plan, (online, busy), False, self.clock.monotonic()
        log.info("probe_mesh_pushed", version=version, nodes=len(online), seconds=round(self.plan_seconds, 3))
        return plan
