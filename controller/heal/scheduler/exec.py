"""Exec backend: a site's own hook scripts carry out each scheduler action.

Why: many clusters wrap Slurm/Kubernetes in local tooling (ticketing, CMDB, a custom
scheduler). A hook is an argv list (no shell); starpulse appends the action and its
arguments and sets STARPULSE_* variables:

    <hook...> cordon|drain|resume <node> <reason>
    <hook...> requeue <job>            (STARPULSE_EXCLUDE, STARPULSE_PREFER: comma lists)
    <hook...> signal_job <job> <SIG>
    <hook...> node_status <node>       (stdout: JSON {"state", "reason", "drained_by_us", "jobs"})
    <hook...> job_nodes <job>          (stdout: node names, whitespace-separated or a JSON list)
    <hook...> list_nodes               (stdout: JSON list of node_status objects with "node")

Exit 0 means done, 75 (EX_TEMPFAIL) a temporary failure worth retrying, anything else a
permanent failure. See deploy/hooks/ for examples.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import structlog

from controller.heal.scheduler.base import (
    ActionResult,
    CommandResult,
    InvalidName,
    NodeStatus,
    SchedulerError,
    run_command,
    sanitize_reason,
    validate_job_id,
    validate_node_id,
    validate_signal,
)

log = structlog.get_logger(__name__)

EX_TEMPFAIL = 75
ACTIONS = ("cordon", "drain", "resume", "requeue", "signal_job", "node_status", "job_nodes", "list_nodes")


class ExecScheduler:
    """Scheduler whose actions are user hook commands, one argv list per action."""

    name = "exec"

    def __init__(
        self, hooks: Mapping[str, list[str]], timeout_s: float = 60.0, env: Mapping[str, str] | None = None
    ) -> None:
        unknown = set(hooks) - set(ACTIONS)
        if unknown:
            raise ValueError(f"unknown hook actions {sorted(unknown)}; known: {ACTIONS}")
        for action, argv in hooks.items():
            if not argv or not all(isinstance(a, str) and a for a in argv):
                raise ValueError(f"hook for {action} must be a non-empty argv list of strings")
        self.hooks = {k: list(v) for k, v in hooks.items()}
        self.timeout_s = timeout_s
        self.env = dict(env or {})

    async def _call(self, action: str, args: list[str], extra_env: dict[str, str]) -> CommandResult | ActionResult:
        hook = self.hooks.get(action)
        if hook is None:
            return ActionResult.failure(f"no hook configured for {action}")
        env = {**self.env, "STARPULSE_ACTION": action, **extra_env}
        res = await run_command([*hook, action, *args], timeout_s=self.timeout_s, env=env)
        log.info("exec_hook", action=action, args=args, rc=res.rc, seconds=round(res.seconds, 3))
        return res

    @staticmethod
    def _result(res: CommandResult | ActionResult, what: str) -> ActionResult:
        if isinstance(res, ActionResult):
            return res
        if res.ok:
            return ActionResult.success(res.stdout.strip().splitlines()[-1] if res.stdout.strip() else what)
        if res.rc is None:
            # Timed out: temporary; could not start (missing/not executable): permanent.
            return ActionResult(False, f"{what}: {res.describe()}", "timed out" not in res.error)
        return ActionResult(False, f"{what}: {res.describe()}", res.rc != EX_TEMPFAIL)

    async def _node_action(self, action: str, node: str, reason: str) -> ActionResult:
        try:
            validate_node_id(node)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        why = sanitize_reason(reason)
        res = await self._call(action, [node, why], {"STARPULSE_NODE": node, "STARPULSE_REASON": why})
        return self._result(res, f"{action} {node}")

    async def cordon(self, node: str, reason: str) -> ActionResult:
        return await self._node_action("cordon", node, reason)

    async def drain(self, node: str, reason: str) -> ActionResult:
        return await self._node_action("drain", node, reason)

    async def resume(self, node: str, reason: str) -> ActionResult:
        """Refuses when a node_status hook says the node was taken out by someone else."""
        if "node_status" in self.hooks:
            try:
                st = await self.node_status(node)
            except (SchedulerError, InvalidName) as exc:
                return ActionResult(False, str(exc), getattr(exc, "permanent", True))
            if st.drained_by_us is False:
                return ActionResult.failure(f"{node} drained by someone else: {st.reason!r}")
        return await self._node_action("resume", node, reason)

    async def requeue(self, job: str, exclude: list[str], prefer: list[str]) -> ActionResult:
        try:
            validate_job_id(job)
            exclude = [validate_node_id(n) for n in exclude]
            prefer = [validate_node_id(n) for n in prefer]
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        env = {"STARPULSE_JOB": job, "STARPULSE_EXCLUDE": ",".join(exclude), "STARPULSE_PREFER": ",".join(prefer)}
        return self._result(await self._call("requeue", [job], env), f"requeue {job}")

    async def signal_job(self, job: str, signal: str) -> ActionResult:
        try:
            validate_job_id(job)
            sig = validate_signal(signal)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        env = {"STARPULSE_JOB": job, "STARPULSE_SIGNAL": sig}
        return self._result(await self._call("signal_job", [job, sig], env), f"signal {job}")

    async def _query(self, action: str, args: list[str], env: dict[str, str]) -> str:
        res = await self._call(action, args, env)
        if isinstance(res, ActionResult):
            raise SchedulerError(res.detail, permanent=True)
        if not res.ok:
            raise SchedulerError(f"{action}: {res.describe()}", permanent=res.rc not in (None, EX_TEMPFAIL))
        return res.stdout

    @staticmethod
    def _status(obj: Any, node: str = "") -> NodeStatus:
        if not isinstance(obj, dict) or "state" not in obj:
            raise SchedulerError(f"hook returned no node status: {obj!r:.200}", permanent=True)
        by_us = obj.get("drained_by_us")
        return NodeStatus(
            state=str(obj["state"]),
            reason=sanitize_reason(str(obj.get("reason", ""))) if obj.get("reason") else "",
            drained_by_us=None if by_us is None else bool(by_us),
            jobs=[str(j) for j in obj.get("jobs", [])],
            node=str(obj.get("node", node)),
        )

    async def node_status(self, node: str) -> NodeStatus:
        validate_node_id(node)
        out = await self._query("node_status", [node], {"STARPULSE_NODE": node})
        try:
            return self._status(json.loads(out), node)
        except ValueError as exc:
            raise SchedulerError(f"node_status hook output is not JSON: {exc}", permanent=True) from exc

    async def job_nodes(self, job: str) -> list[str]:
        validate_job_id(job)
        out = (await self._query("job_nodes", [job], {"STARPULSE_JOB": job})).strip()
        names = json.loads(out) if out.startswith("[") else out.split()
        return [validate_node_id(str(n)) for n in names]

    async def list_nodes(self) -> list[NodeStatus]:
        out = await self._query("list_nodes", [], {})
        try:
            return [self._status(o) for o in json.loads(out)]
        except (ValueError, TypeError) as exc:
            raise SchedulerError(f"list_nodes hook output unreadable: {exc}", permanent=True) from exc
