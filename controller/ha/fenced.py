"""A scheduler that acts only while this replica provably leads, and never does one thing twice.

Before every action (cordon, drain, resume, requeue, signal):

1. the local lease deadline must not have passed (``Elector.holds``), and
2. every pending state change is flushed to etcd under the fencing compare
   (``StateMirror.check``); this carries the action's own "planned" row, so a new leader
   knows about the action before it can have happened.

A deposed leader fails one of the two and gets ``NotLeader`` instead of an action.

Exactly once: the healer plans each action before performing it and marks it after; a
new leader replays what is still planned. Whether the old leader performed it before
dying is read back from the scheduler itself (a drain by us already in place, a job no
longer on the node) and the action is then skipped, so it is never done twice even by
a backend whose actions are not idempotent.
"""

from __future__ import annotations

import structlog

from controller.ha.election import Elector, NotLeader
from controller.ha.mirror import StateMirror
from controller.heal.scheduler.base import (
    CORDONED,
    DRAINED,
    DRAINING,
    ActionResult,
    NodeStatus,
    Scheduler,
    SchedulerError,
)

log = structlog.get_logger(__name__)

TAKEN_OUT = (CORDONED, DRAINING, DRAINED)


class FencedScheduler:
    """Wraps any Scheduler; queries pass through, actions are fenced and read back."""

    def __init__(self, inner: Scheduler, elector: Elector, mirror: StateMirror, margin_s: float = 0.5) -> None:
        self.inner = inner
        self.name = inner.name
        self.elector = elector
        self.mirror = mirror
        self.margin_s = margin_s
        self.skipped: list[tuple[str, str]] = []  # (action, target) found already done on read-back

    async def fence(self, action: str, target: str) -> None:
        """Raise NotLeader unless this replica holds the lease, locally and in etcd."""
        if not self.elector.holds(self.margin_s):
            log.error("ha_action_refused_no_lease", action=action, target=target)
            raise NotLeader(f"{action} {target}: this replica does not hold the leader lease")
        await self.mirror.check()

    async def _taken_out_by_us(self, node: str) -> bool:
        try:
            status = await self.inner.node_status(node)
        except SchedulerError:
            return False  # cannot read back: act (the backend's own idempotency is the fallback)
        return status.state in TAKEN_OUT and bool(status.drained_by_us)

    def _skip(self, action: str, target: str, why: str) -> ActionResult:
        self.skipped.append((action, target))
        log.warning("ha_action_already_done", action=action, target=target, detail=why)
        return ActionResult.success(f"already done ({why})")

    # -- actions -------------------------------------------------------------------------------
    async def cordon(self, node: str, reason: str) -> ActionResult:
        await self.fence("cordon", node)
        if await self._taken_out_by_us(node):
            return self._skip("cordon", node, "node already out of service by us")
        return await self.inner.cordon(node, reason)

    async def drain(self, node: str, reason: str) -> ActionResult:
        await self.fence("drain", node)
        if await self._taken_out_by_us(node):
            return self._skip("drain", node, "node already drained by us")
        return await self.inner.drain(node, reason)

    async def resume(self, node: str, reason: str) -> ActionResult:
        await self.fence("resume", node)
        return await self.inner.resume(node, reason)

    @property
    def can_reboot(self) -> bool:
        """Whether the wrapped scheduler reboots nodes itself (else the repair loop asks the agent)."""
        return callable(getattr(self.inner, "reboot", None))

    async def reboot(self, node: str, reason: str) -> ActionResult:
        await self.fence("reboot", node)
        inner = getattr(self.inner, "reboot", None)
        if inner is None:
            return ActionResult.failure(f"{self.inner.name} cannot reboot nodes")
        result: ActionResult = await inner(node, reason)
        return result

    async def requeue(self, job: str, exclude: list[str], prefer: list[str]) -> ActionResult:
        await self.fence("requeue", job)
        try:
            placed = await self.inner.job_nodes(job)
        except SchedulerError:
            placed = None
        if placed is not None and not set(placed) & set(exclude):  # pending (no nodes) counts as moved
            return self._skip("requeue", job, f"job already off {','.join(exclude)} (on {','.join(placed) or '-'})")
        return await self.inner.requeue(job, exclude, prefer)

    async def signal_job(self, job: str, signal: str) -> ActionResult:
        await self.fence("signal_job", job)
        return await self.inner.signal_job(job, signal)

    # -- queries -------------------------------------------------------------------------------
    async def node_status(self, node: str) -> NodeStatus:
        return await self.inner.node_status(node)

    async def job_nodes(self, job: str) -> list[str]:
        return await self.inner.job_nodes(job)

    async def list_nodes(self) -> list[NodeStatus]:
        return await self.inner.list_nodes()
