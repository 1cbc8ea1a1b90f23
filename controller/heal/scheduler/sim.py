"""In-memory scheduler for the scenario runner, the demo and unit tests.

Why: remediation logic must be exercised thousands of times without a cluster. It keeps
Slurm's semantics (a drain lets running jobs finish, the node shows "draining"; reasons
carry our prefix so someone else's drain is recognised and never resumed by us) and is
deterministic: no sleeps, no randomness, placement in sorted node order.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

import structlog

from controller.heal.scheduler.base import (
    ALLOCATED,
    DRAINED,
    DRAINING,
    IDLE,
    ActionResult,
    InvalidName,
    NodeStatus,
    SchedulerError,
    sanitize_reason,
    validate_job_id,
    validate_node_id,
    validate_signal,
)

log = structlog.get_logger(__name__)


@dataclass
class SimNode:
    name: str
    drained: bool = False
    reason: str = ""
    jobs: list[str] = field(default_factory=list)


@dataclass
class SimJob:
    name: str
    size: int
    nodes: list[str] = field(default_factory=list)
    # The job's flag "may run on fewer nodes": the fewest it accepts after a requeue (Slurm's
    # --nodes=MIN-MAX, an elastic torchrun's --nnodes=MIN:MAX); equal to size: it waits for all.
    min_size: int = 0
    state: str = "running"  # running | pending
    restarts: int = 0
    signals: list[str] = field(default_factory=list)


class SimScheduler:
    """A Scheduler whose cluster lives in dicts; `actions` records every change made."""

    name = "sim"

    def __init__(self, nodes: list[str] | None = None, reason_prefix: str = "starpulse:") -> None:
        self.reason_prefix = reason_prefix
        self.nodes: dict[str, SimNode] = {}
        self.jobs: dict[str, SimJob] = {}
        self.actions: list[tuple[str, str, str]] = []
        self.fail_next: dict[tuple[str, str], ActionResult] = {}
        for n in nodes or []:
            self.add_node(n)

    # -- setup helpers -------------------------------------------------------------
    def add_node(self, node: str) -> None:
        validate_node_id(node)
        self.nodes.setdefault(node, SimNode(node))

    def add_job(self, job: str, nodes: list[str], min_nodes: int | None = None) -> None:
        """Start job running on nodes (created when unknown); ``min_nodes``: it may be requeued
        on as few as that many when not enough are free (None: never on fewer)."""
        validate_job_id(job)
        if min_nodes is not None and not 1 <= min_nodes <= len(nodes):
            raise ValueError(f"min_nodes of job {job} must be 1..{len(nodes)}, got {min_nodes}")
        for n in nodes:
            self.add_node(n)
            self.nodes[n].jobs.append(job)
        self.jobs[job] = SimJob(job, size=len(nodes), nodes=list(nodes), min_size=min_nodes or len(nodes))

    def finish_job(self, job: str) -> None:
        j = self.jobs.pop(job)
        for n in j.nodes:
            self.nodes[n].jobs.remove(job)

    def drain_external(self, node: str, reason: str) -> None:
        """A drain made by someone else (an operator): no starpulse prefix on the reason."""
        self.add_node(node)
        self.nodes[node].drained = True
        self.nodes[node].reason = sanitize_reason(reason)

    def inject_failure(self, action: str, target: str, result: ActionResult) -> None:
        """Make the next `action` on `target` return `result` (for retry/guard tests)."""
        self.fail_next[(action, target)] = result

    # -- internals -----------------------------------------------------------------
    def _status(self, n: SimNode) -> NodeStatus:
        if n.drained:
            state = DRAINING if n.jobs else DRAINED
            by_us: bool | None = n.reason.startswith(self.reason_prefix)
        else:
            state = ALLOCATED if n.jobs else IDLE
            by_us = None
        return NodeStatus(state=state, reason=n.reason, drained_by_us=by_us, jobs=list(n.jobs), node=n.name)

    def _injected(self, action: str, target: str) -> ActionResult | None:
        return self.fail_next.pop((action, target), None)

    def _node(self, node: str) -> SimNode | ActionResult:
        try:
            validate_node_id(node)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        if node not in self.nodes:
            return ActionResult.failure(f"unknown node {node}")
        return self.nodes[node]

    # -- Scheduler -----------------------------------------------------------------
    async def cordon(self, node: str, reason: str) -> ActionResult:
        return await self.drain(node, reason)

    async def drain(self, node: str, reason: str) -> ActionResult:
        n = self._node(node)
        if isinstance(n, ActionResult):
            return n
        if (injected := self._injected("drain", node)) is not None:
            return injected
        if n.drained:
            who = "us" if n.reason.startswith(self.reason_prefix) else "someone else"
            return ActionResult.success(f"already drained by {who}: {n.reason}")
        n.drained = True
        n.reason = sanitize_reason(f"{self.reason_prefix} {sanitize_reason(reason)}")
        self.actions.append(("drain", node, n.reason))
        log.info("sim_drained", node=node, reason=n.reason)
        return ActionResult.success(f"drain {node}: {n.reason}")

    async def resume(self, node: str, reason: str) -> ActionResult:
        n = self._node(node)
        if isinstance(n, ActionResult):
            return n
        if (injected := self._injected("resume", node)) is not None:
            return injected
        if not n.drained:
            return ActionResult.success(f"{node} already in service")
        if not n.reason.startswith(self.reason_prefix):
            return ActionResult.failure(f"{node} drained by someone else: {n.reason!r}")
        n.drained, n.reason = False, ""
        self.actions.append(("resume", node, sanitize_reason(reason)))
        log.info("sim_resumed", node=node)
        started = self._start_pending()
        return ActionResult.success(f"resumed {node}" + (f"; started pending {', '.join(started)}" if started else ""))

    def _free(self, n: str, taken: Collection[str] = ()) -> bool:
        node = self.nodes.get(n)
        return node is not None and not node.drained and not node.jobs and n not in taken

    def _start_pending(self) -> list[str]:
        """A node came back: pending jobs start where enough nodes are free, as a scheduler's
        queue does (in name order; a job that waited starts at its full size)."""
        started = []
        for job in sorted((j for j in self.jobs.values() if j.state == "pending"), key=lambda j: j.name):
            free = [n for n in sorted(self.nodes) if self._free(n)]
            if len(free) < job.size:
                continue
            job.nodes, job.state = free[: job.size], "running"
            for n in job.nodes:
                self.nodes[n].jobs.append(job.name)
            self.actions.append(("start", job.name, ",".join(job.nodes)))
            log.info("sim_pending_started", job=job.name, nodes=job.nodes)
            started.append(job.name)
        return started

    async def node_status(self, node: str) -> NodeStatus:
        validate_node_id(node)
        if node not in self.nodes:
            raise SchedulerError(f"unknown node {node}", permanent=True)
        return self._status(self.nodes[node])

    async def list_nodes(self) -> list[NodeStatus]:
        return [self._status(self.nodes[n]) for n in sorted(self.nodes)]

    async def job_nodes(self, job: str) -> list[str]:
        validate_job_id(job)
        if job not in self.jobs:
            raise SchedulerError(f"unknown job {job}", permanent=True)
        return list(self.jobs[job].nodes)

    async def requeue(self, job: str, exclude: list[str], prefer: list[str]) -> ActionResult:
        """Move job off `exclude`: keep its good nodes, fill from `prefer`, then free nodes."""
        try:
            validate_job_id(job)
            for n in [*exclude, *prefer]:
                validate_node_id(n)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        j = self.jobs.get(job)
        if j is None:
            return ActionResult.failure(f"unknown job {job}")
        if (injected := self._injected("requeue", job)) is not None:
            return injected
        if j.state == "running" and exclude and not set(j.nodes) & set(exclude):
            return ActionResult.success(f"job {job} already running on {','.join(j.nodes)}")
        for n in j.nodes:
            self.nodes[n].jobs.remove(job)
        keep = [n for n in j.nodes if n not in exclude and not self.nodes[n].drained]

        taken = {*exclude, *keep}
        candidates = [n for n in prefer if self._free(n, taken)]
        candidates += [n for n in sorted(self.nodes) if self._free(n, taken) and n not in prefer]
        placed = (keep + candidates)[: j.size]
        j.restarts += 1
        self.actions.append(("requeue", job, ",".join(placed)))
        if len(placed) < j.min_size:
            j.nodes, j.state = [], "pending"
            log.info("sim_requeued_pending", job=job)
            return ActionResult.success(
                f"job {job} requeued: pending, waiting for capacity (needs {j.min_size} free nodes, {len(placed)} free)"
            )
        j.nodes, j.state = placed, "running"
        for n in placed:
            self.nodes[n].jobs.append(job)
        log.info("sim_requeued", job=job, nodes=placed, restarts=j.restarts)
        if len(placed) < j.size:
            return ActionResult.success(
                f"job {job} requeued on fewer nodes: {len(placed)} of {j.size} (it allows {j.min_size}), "
                f"running on {','.join(placed)}"
            )
        return ActionResult.success(f"job {job} requeued: running on {','.join(placed)}")

    async def signal_job(self, job: str, signal: str) -> ActionResult:
        try:
            validate_job_id(job)
            sig = validate_signal(signal)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        j = self.jobs.get(job)
        if j is None or j.state != "running":
            return ActionResult.failure(f"job {job} is not running")
        j.signals.append(sig)
        self.actions.append(("signal", job, sig))
        return ActionResult.success(f"sent {sig} to job {job}")
