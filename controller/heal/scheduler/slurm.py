"""Slurm backend: drain/resume nodes with a marked reason, requeue jobs onto a spare.

Checked against real Slurm 22.05 (slurmctld + four slurmd on one host, see
tests/e2e/test_slurm_backend.py). What it relies on:

* `scontrol update NodeName=X State=DRAIN Reason=...` takes the node out; running jobs
  keep running (the node shows "draining") — Slurm's DRAIN is what Kubernetes calls a
  cordon, so `cordon` and `drain` issue the same command; moving the work is `requeue`.
* Our reasons start with `reason_prefix` ("starpulse:"). That is how `drained_by_us` is
  derived, and why `resume` refuses a drain someone else made (their reason lacks it).
* Requeue in 22.05: `scontrol requeue <id>` puts the batch job back to pending but holds
  it ~2 minutes (Reason=BeginTime). While it is pending, `scontrol update JobId=<id>
  ExcNodeList=<bad> ReqNodeList=<spare>` is accepted (ReqNodeList means "must include"),
  and `scontrol update JobId=<id> StartTime=now` starts it at once — but only once the
  old run has ended *and* the wall-clock second has moved on: slurmd revokes the old
  credential with one-second resolution, and a relaunch in the same second fails the job
  ("Job credential revoked"). Hence the poll and `requeue_settle_s`.
* `scancel --signal=USR1 --full <id>` reaches the batch shell (a bash trap) as well as its
  children and steps; `--batch` reaches only the batch shell.

scontrol has no --json in 22.05: node state comes from `sinfo --json`, jobs from
`squeue --json` and `scontrol -o show job`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path
from typing import Any

import structlog

from controller.heal.scheduler.base import (
    ALLOCATED,
    DOWN,
    DRAINED,
    DRAINING,
    IDLE,
    MIXED,
    UNKNOWN,
    ActionResult,
    CommandResult,
    InvalidName,
    NodeStatus,
    SchedulerError,
    run_command,
    sanitize_reason,
    validate_node_id,
    validate_signal,
)

log = structlog.get_logger(__name__)

_SLURM_JOB_ID = re.compile(r"^[0-9]{1,10}(_[0-9]{1,10})?$")
_PERMANENT_ERRORS = (
    "invalid node name",
    "invalid job id",
    "invalid user id",
    "access/permission denied",
    "only batch jobs",
    "presently disabled",
    "not a batch job",
    "already completing or completed",
    "requeue disabled",
    "invalid",
)
_TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def validate_slurm_job_id(job: str) -> str:
    """Return job when it is a Slurm job id (digits, optionally an array task `123_4`)."""
    if not isinstance(job, str) or not _SLURM_JOB_ID.fullmatch(job):
        raise InvalidName(f"invalid Slurm job id {job!r}")
    return job


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist like `gpu[01,03-04],cpu7` (one bracket group per item)."""
    expr = (expr or "").strip()
    if not expr or expr in {"(null)", "None"}:
        return []
    items: list[str] = []
    depth, cur = 0, ""
    for ch in expr:
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
            continue
        depth += ch == "["
        depth -= ch == "]"
        cur += ch
    items.append(cur)
    out: list[str] = []
    for item in filter(None, items):
        m = re.fullmatch(r"([^\[\]]*)\[([0-9,\-]+)\]([^\[\]]*)", item)
        if not m:
            if "[" in item:
                raise ValueError(f"unsupported hostlist {expr!r}")
            out.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for i in range(int(lo), int(hi or lo) + 1):
                out.append(f"{prefix}{i:0{width}d}{suffix}")
    return out


def _parse_oneliner(text: str) -> dict[str, str]:
    """Key=value pairs of one `scontrol -o show` line (values containing spaces kept whole)."""
    fields: dict[str, str] = {}
    key = None
    for tok in text.strip().split(" "):
        k, sep, v = tok.partition("=")
        if sep and re.fullmatch(r"[A-Za-z][A-Za-z0-9_:/]*", k):
            key = k
            fields[k] = v
        elif key is not None and tok:
            fields[key] += " " + tok
    return fields


def _classify(res: CommandResult, what: str) -> ActionResult:
    """Map a failed command to a temporary or permanent ActionResult."""
    detail = f"{what}: {res.describe()}"
    if res.rc is None:
        return ActionResult.temporary(detail) if "timed out" in res.error else ActionResult.failure(detail)
    text = (res.stderr + res.stdout).lower()
    if any(p in text for p in _PERMANENT_ERRORS) and "unable to contact" not in text:
        return ActionResult.failure(detail)
    return ActionResult.temporary(detail)


class SlurmScheduler:
    """Scheduler backed by the Slurm client commands (scontrol, sinfo, squeue, scancel)."""

    name = "slurm"

    def __init__(
        self,
        conf_path: str | Path | None = None,
        bin_dir: str | Path | None = None,
        timeout_s: float = 30.0,
        reason_prefix: str = "starpulse:",
        requeue_settle_s: float = 1.1,
        requeue_end_timeout_s: float = 60.0,
        start_wait_s: float = 10.0,
        signal_scope: str = "full",
        poll_s: float = 0.2,
    ) -> None:
        if signal_scope not in {"full", "batch"}:
            raise ValueError("signal_scope must be 'full' or 'batch'")
        self.conf_path = str(conf_path) if conf_path else None
        self.bin_dir = Path(bin_dir) if bin_dir else None
        self.timeout_s = timeout_s
        self.reason_prefix = reason_prefix
        self.requeue_settle_s = requeue_settle_s
        self.requeue_end_timeout_s = requeue_end_timeout_s
        self.start_wait_s = start_wait_s
        self.signal_scope = signal_scope
        self.poll_s = poll_s

    TOOLS = ("scontrol", "sinfo", "squeue", "scancel")

    def missing_tools(self) -> list[str]:
        """The Slurm client commands this scheduler cannot find (bin_dir, else PATH): a controller without
        them would start, then fail every drain, so its settings refuse it up front."""
        import os
        import shutil

        if self.bin_dir is not None:
            return [t for t in self.TOOLS if not os.access(self.bin_dir / t, os.X_OK)]
        return [t for t in self.TOOLS if shutil.which(t) is None]

    # -- plumbing ------------------------------------------------------------------
    async def _run(self, tool: str, *args: str) -> CommandResult:
        exe = str(self.bin_dir / tool) if self.bin_dir else tool
        env = {"SLURM_CONF": self.conf_path} if self.conf_path else None
        return await run_command([exe, *args], timeout_s=self.timeout_s, env=env)

    def _ours(self, reason: str) -> bool:
        return reason.startswith(self.reason_prefix)

    def _marked(self, reason: str) -> str:
        text = sanitize_reason(reason)
        return text if self._ours(text) else sanitize_reason(f"{self.reason_prefix} {text}")

    async def _sinfo_nodes(self) -> list[dict[str, Any]]:
        res = await self._run("sinfo", "--json")
        if not res.ok:
            raise SchedulerError(f"sinfo: {res.describe()}", permanent=False)
        try:
            return list(json.loads(res.stdout).get("nodes", []))
        except (ValueError, AttributeError) as exc:
            raise SchedulerError(f"sinfo --json unreadable: {exc}") from exc

    async def _jobs_by_node(self) -> dict[str, list[str]]:
        res = await self._run("squeue", "--json")
        if not res.ok:
            raise SchedulerError(f"squeue: {res.describe()}", permanent=False)
        out: dict[str, list[str]] = {}
        for job in json.loads(res.stdout).get("jobs", []):
            state = str(job.get("job_state", ""))
            if state not in {"RUNNING", "COMPLETING", "SUSPENDED", "CONFIGURING"}:
                continue
            try:
                hosts = expand_hostlist(str(job.get("nodes", "")))
            except ValueError:
                hosts = await self._hostnames(str(job.get("nodes", "")))
            for h in hosts:
                out.setdefault(h, []).append(str(job.get("job_id")))
        return out

    async def _hostnames(self, expr: str) -> list[str]:
        try:
            return expand_hostlist(expr)
        except ValueError:
            res = await self._run("scontrol", "show", "hostnames", expr)
            return res.stdout.split() if res.ok else []

    def _status_from(self, raw: dict[str, Any], jobs: list[str]) -> NodeStatus:
        base = str(raw.get("state", "")).lower()
        flags = {str(f).upper() for f in raw.get("state_flags", []) or []}
        reason = str(raw.get("reason", "") or "")
        if "DRAIN" in flags:
            state = DRAINING if base in {ALLOCATED, MIXED, "completing"} or "COMPLETING" in flags else DRAINED
        elif base in {DOWN, "fail", "future"}:
            state = DOWN
        elif base in {IDLE, ALLOCATED, MIXED}:
            state = base
        else:
            state = base or UNKNOWN
        taken_out = state in {DRAINING, DRAINED, DOWN}
        return NodeStatus(
            state=state,
            reason=reason,
            drained_by_us=self._ours(reason) if taken_out else None,
            jobs=jobs,
            node=str(raw.get("name", "")),
        )

    async def _show_job(self, job: str) -> dict[str, str]:
        res = await self._run("scontrol", "-o", "show", "job", job)
        if not res.ok:
            permanent = "invalid job id" in (res.stderr + res.stdout).lower()
            raise SchedulerError(f"scontrol show job {job}: {res.describe()}", permanent=permanent)
        return _parse_oneliner(res.stdout.splitlines()[0] if res.stdout else "")

    # -- queries -------------------------------------------------------------------
    async def node_status(self, node: str) -> NodeStatus:
        validate_node_id(node)
        for raw in await self._sinfo_nodes():
            if raw.get("name") == node:
                jobs = (await self._jobs_by_node()).get(node, [])
                return self._status_from(raw, jobs)
        raise SchedulerError(f"unknown node {node}", permanent=True)

    async def list_nodes(self) -> list[NodeStatus]:
        raws = await self._sinfo_nodes()
        jobs = await self._jobs_by_node()
        seen: dict[str, NodeStatus] = {}
        for raw in raws:  # sinfo repeats a node once per partition
            name = str(raw.get("name", ""))
            seen.setdefault(name, self._status_from(raw, jobs.get(name, [])))
        return list(seen.values())

    async def job_nodes(self, job: str) -> list[str]:
        validate_slurm_job_id(job)
        fields = await self._show_job(job)
        return await self._hostnames(fields.get("NodeList", ""))

    # -- actions -------------------------------------------------------------------
    async def _status_or_refusal(self, node: str) -> NodeStatus | ActionResult:
        """The node's status before an action, or the failure to answer with (a bad name, no answer)."""
        try:
            validate_node_id(node)
            return await self.node_status(node)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        except SchedulerError as exc:
            return ActionResult(False, exc.detail, exc.permanent)

    async def cordon(self, node: str, reason: str) -> ActionResult:
        """Slurm DRAIN already lets running jobs finish: a cordon is a drain here."""
        return await self.drain(node, reason)

    async def drain(self, node: str, reason: str) -> ActionResult:
        status = await self._status_or_refusal(node)
        if isinstance(status, ActionResult):
            return status
        if status.state in {DRAINING, DRAINED}:
            who = "us" if status.drained_by_us else "someone else"
            log.info("slurm_drain_noop", node=node, state=status.state, reason=status.reason, by=who)
            return ActionResult.success(f"already {status.state} by {who}: {status.reason}")
        marked = self._marked(reason)
        res = await self._run("scontrol", "update", f"NodeName={node}", "State=DRAIN", f"Reason={marked}")
        if not res.ok:
            log.warning("slurm_drain_failed", node=node, detail=res.describe())
            return _classify(res, f"drain {node}")
        log.info("slurm_drained", node=node, reason=marked, jobs=status.jobs)
        return ActionResult.success(f"drain {node}: {marked}")

    async def resume(self, node: str, reason: str) -> ActionResult:
        status = await self._status_or_refusal(node)
        if isinstance(status, ActionResult):
            return status
        if status.state not in {DRAINING, DRAINED, DOWN}:
            return ActionResult.success(f"{node} already in service ({status.state})")
        if not status.drained_by_us:
            log.info("slurm_resume_refused", node=node, reason=status.reason)
            return ActionResult.failure(f"{node} drained by someone else: {status.reason!r}")
        res = await self._run("scontrol", "update", f"NodeName={node}", "State=RESUME")
        if not res.ok:
            return _classify(res, f"resume {node}")
        log.info("slurm_resumed", node=node, why=sanitize_reason(reason), was=status.reason)
        return ActionResult.success(f"resumed {node}")

    async def reboot(self, node: str, reason: str) -> ActionResult:
        """``scontrol reboot ASAP nextstate=DOWN reason="starpulse: ..."``: Slurm reboots the node
        (its RebootProgram) once it is idle, and it comes back DOWN with our reason, so it takes
        no work until validation passes and ``resume`` (which checks that reason) puts it back."""
        status = await self._status_or_refusal(node)
        if isinstance(status, ActionResult):
            return status
        if status.state in {DRAINING, DRAINED, DOWN} and not status.drained_by_us:
            return ActionResult.failure(f"{node} taken out by someone else: {status.reason!r}; not rebooting it")
        marked = self._marked(reason)
        res = await self._run("scontrol", "reboot", "ASAP", "nextstate=DOWN", f"reason={marked}", node)
        if not res.ok:
            log.warning("slurm_reboot_failed", node=node, detail=res.describe())
            return _classify(res, f"reboot {node}")
        log.info("slurm_reboot_requested", node=node, reason=marked)
        return ActionResult.success(f"reboot {node} requested: {marked}")

    async def signal_job(self, job: str, signal: str) -> ActionResult:
        try:
            validate_slurm_job_id(job)
            sig = validate_signal(signal)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        res = await self._run("scancel", f"--signal={sig}", f"--{self.signal_scope}", job)
        if not res.ok:
            return _classify(res, f"signal {job}")
        log.info("slurm_signalled", job=job, signal=sig, scope=self.signal_scope)
        return ActionResult.success(f"sent {sig} to job {job}")

    async def requeue(self, job: str, exclude: list[str], prefer: list[str]) -> ActionResult:
        """Requeue job off `exclude`, require `prefer` (idle spares) in the next allocation.

        Idempotent: a job already running on none of `exclude` is left alone, and a job
        already pending is only re-pointed and released.
        """
        try:
            validate_slurm_job_id(job)
            exclude = [validate_node_id(n) for n in exclude]
            prefer = [validate_node_id(n) for n in prefer if n not in exclude]
            fields = await self._show_job(job)
        except InvalidName as exc:
            return ActionResult.failure(str(exc))
        except SchedulerError as exc:
            return ActionResult(False, exc.detail, exc.permanent)
        t0 = time.monotonic()
        state = fields.get("JobState", "")
        old_nodes = await self._hostnames(fields.get("NodeList", ""))
        if state == "RUNNING" and exclude and not set(old_nodes) & set(exclude):  # none: restart in place
            return ActionResult.success(f"job {job} already running on {','.join(old_nodes)}")
        if state != "PENDING":
            res = await self._run("scontrol", "requeue", job)
            if not res.ok:
                return _classify(res, f"requeue {job}")
            log.info("slurm_requeued", job=job, state=state, nodes=old_nodes)

        # Point the pending job away from the bad nodes and at the spares.
        updates = []
        excluded = sorted(set(await self._hostnames(fields.get("ExcNodeList", ""))) | set(exclude))
        if excluded:
            updates.append(f"ExcNodeList={','.join(excluded)}")
        want = await self._usable_spares(prefer, int(fields.get("NumNodes", "1").split("-")[0] or 1))
        old_req = set(await self._hostnames(fields.get("ReqNodeList", "")))
        if want:
            updates.append(f"ReqNodeList={','.join(want)}")
        elif old_req & set(exclude):
            updates.append("ReqNodeList=")  # an old pin on the bad node would block the job forever
        if updates:
            res = await self._run("scontrol", "update", f"JobId={job}", *updates)
            if not res.ok:
                return _classify(res, f"update {job} {' '.join(updates)}")

        ended = await self._wait_old_run_ended(job, old_nodes)
        if not ended.ok:
            return ended
        await asyncio.sleep(self.requeue_settle_s)
        res = await self._run("scontrol", "update", f"JobId={job}", "StartTime=now")
        if not res.ok:
            return _classify(res, f"release {job}")
        detail = await self._wait_started(job)
        if detail.split(" ", 1)[0].upper() in _TERMINAL:
            return ActionResult.failure(f"job {job} did not restart: {detail}")
        log.info("slurm_requeue_done", job=job, exclude=exclude, prefer=want, seconds=round(time.monotonic() - t0, 2))
        return ActionResult.success(f"job {job} requeued: {detail}")

    async def _usable_spares(self, prefer: list[str], num_nodes: int) -> list[str]:
        """Preferred nodes that can take the job now (ReqNodeList is a hard requirement)."""
        if not prefer:
            return []
        try:
            by_name = {s.node: s for s in await self.list_nodes()}
        except SchedulerError:
            return []
        usable = [n for n in prefer if n in by_name and by_name[n].state == IDLE]
        return usable[: max(num_nodes, 1)]

    async def _wait_old_run_ended(self, job: str, old_nodes: list[str]) -> ActionResult:
        deadline = time.monotonic() + self.requeue_end_timeout_s
        while True:
            try:
                state = (await self._show_job(job)).get("JobState", "")
                nodes = {s.node: s for s in await self.list_nodes()}
            except SchedulerError as exc:
                return ActionResult(False, exc.detail, exc.permanent)
            if state in _TERMINAL:
                return ActionResult.failure(f"job {job} ended ({state}) instead of requeueing")
            busy = [n for n in old_nodes if job in nodes.get(n, NodeStatus(UNKNOWN)).jobs]
            if state == "PENDING" and not busy:
                return ActionResult.success()
            if time.monotonic() > deadline:
                return ActionResult.temporary(f"job {job} still {state} on {busy} after {self.requeue_end_timeout_s}s")
            await asyncio.sleep(self.poll_s)

    async def _wait_started(self, job: str) -> str:
        deadline = time.monotonic() + self.start_wait_s
        fields: dict[str, str] = {}
        while time.monotonic() < deadline:
            try:
                fields = await self._show_job(job)
            except SchedulerError:
                break
            if fields.get("JobState") == "RUNNING":
                return f"running on {fields.get('NodeList')}"
            await asyncio.sleep(self.poll_s)
        return f"{fields.get('JobState', 'unknown').lower()} (reason {fields.get('Reason', '?')})"
