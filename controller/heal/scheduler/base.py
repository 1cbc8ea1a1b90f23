"""The one interface every scheduler backend implements, and the checks they share.

Why an interface: the remediation state machine must cordon, drain, requeue and resume
the same way whether the cluster runs Slurm, Kubernetes, a site's own scripts or the
in-memory simulation. Every action is idempotent (calling it twice is harmless) and
returns an `ActionResult` instead of raising for expected failures, with `permanent`
telling the orchestrator whether a retry can help (a timeout or a PodDisruptionBudget:
retry; a drain someone else made or an unknown node: don't).

Names come from the network, so node and job names are validated before any command is
built; reasons are sanitised to one printable, length-capped line and always travel as
a single argv element; commands run with asyncio.create_subprocess_exec, never a shell,
and under a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import structlog

from starpulse.core.names import InvalidName, validate_node_id

log = structlog.get_logger(__name__)

__all__ = [
    "ActionResult",
    "CommandResult",
    "InvalidName",
    "NodeStatus",
    "Scheduler",
    "SchedulerError",
    "run_command",
    "sanitize_reason",
    "validate_job_id",
    "validate_node_id",
    "validate_signal",
]

REASON_MAX_LEN = 120
_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]{0,126}(/[A-Za-z0-9][A-Za-z0-9._-]{0,252})?$")
_SIGNALS = frozenset({"USR1", "USR2", "TERM", "INT", "HUP", "CONT", "STOP", "KILL", "QUIT"})

# Normalised node states every backend reports.
IDLE, ALLOCATED, MIXED, DRAINING, DRAINED, CORDONED, DOWN, UNKNOWN = (
    "idle",
    "allocated",
    "mixed",
    "draining",
    "drained",
    "cordoned",
    "down",
    "unknown",
)


@dataclass(frozen=True)
class ActionResult:
    """Outcome of one scheduler action. `permanent` is only meaningful when not ok."""

    ok: bool
    detail: str = ""
    permanent: bool = False

    @classmethod
    def success(cls, detail: str = "") -> ActionResult:
        return cls(True, detail, False)

    @classmethod
    def temporary(cls, detail: str) -> ActionResult:
        """A failure a retry may fix (timeout, API busy, PDB blocking an eviction)."""
        return cls(False, detail, False)

    @classmethod
    def failure(cls, detail: str) -> ActionResult:
        """A failure no retry fixes (bad name, unknown node, someone else's drain)."""
        return cls(False, detail, True)


@dataclass
class NodeStatus:
    """A node as the scheduler sees it. drained_by_us is None when not drained/cordoned."""

    state: str
    reason: str = ""
    drained_by_us: bool | None = None
    jobs: list[str] = field(default_factory=list)
    node: str = ""


class SchedulerError(RuntimeError):
    """A query (node_status, job_nodes, list_nodes) that could not be answered."""

    def __init__(self, detail: str, permanent: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.permanent = permanent


@runtime_checkable
class Scheduler(Protocol):
    """What the remediation orchestrator needs from a workload scheduler.

    Actions return ActionResult and never raise for expected failures; queries raise
    SchedulerError (or InvalidName) because they have no sensible empty answer.
    """

    name: str

    async def cordon(self, node: str, reason: str) -> ActionResult:
        """Stop new work landing on node; running work continues."""
        ...

    async def drain(self, node: str, reason: str) -> ActionResult:
        """Cordon and move running work off node (Slurm: running jobs finish or are requeued)."""
        ...

    async def resume(self, node: str, reason: str) -> ActionResult:
        """Return node to service, but only when we took it out."""
        ...

    async def node_status(self, node: str) -> NodeStatus: ...

    async def job_nodes(self, job: str) -> list[str]: ...

    async def requeue(self, job: str, exclude: list[str], prefer: list[str]) -> ActionResult:
        """Restart job away from `exclude`, on `prefer` (the spares) when given.

        Both empty: restart it where it runs (a hung job whose evidence names no node); the
        caller's planned-action log makes that exactly-once, not the scheduler.
        """
        ...

    async def signal_job(self, job: str, signal: str) -> ActionResult:
        """Send a signal (e.g. USR1 to checkpoint) to the job's processes."""
        ...

    async def list_nodes(self) -> list[NodeStatus]: ...


def validate_job_id(job: str) -> str:
    """Return job when it is a safe job name: letters, digits, . _ + - (optionally ns/name)."""
    if not isinstance(job, str) or not _JOB_ID.fullmatch(job):
        raise InvalidName(f"invalid job id {job!r}")
    return job


def validate_signal(sig: str) -> str:
    """Return the bare signal name (USR1, TERM, ...) when it is one we pass on."""
    name = (sig or "").upper().removeprefix("SIG")
    if name not in _SIGNALS:
        raise InvalidName(f"invalid signal {sig!r}; one of {sorted(_SIGNALS)}")
    return name


def sanitize_reason(reason: str, max_len: int = REASON_MAX_LEN) -> str:
    """One printable ASCII line, length-capped: safe as a single argv element or label value."""
    text = "".join(c if c.isascii() and c.isprintable() else " " for c in str(reason or ""))
    text = " ".join(text.split())
    if len(text) > max_len:
        text = text[: max_len - 3].rstrip() + "..."
    return text or "unspecified"


@dataclass(frozen=True)
class CommandResult:
    """What a command returned; rc is None when it timed out or could not be started."""

    argv: tuple[str, ...]
    rc: int | None
    stdout: str
    stderr: str
    seconds: float
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.rc == 0

    def describe(self) -> str:
        if self.error:
            return self.error
        msg = (self.stderr.strip() or self.stdout.strip()).splitlines()
        return f"{self.argv[0]} rc={self.rc}: {msg[-1] if msg else ''}"


async def run_command(argv: list[str], timeout_s: float = 30.0, env: Mapping[str, str] | None = None) -> CommandResult:
    """Run argv without a shell under a timeout; kill its process group when the timeout passes."""
    t0 = time.monotonic()
    full_env = {**os.environ, **(env or {})}
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=full_env,
            start_new_session=True,  # its own process group, so a timeout kills hook children too
        )
    except (FileNotFoundError, PermissionError) as exc:
        return CommandResult(tuple(argv), None, "", "", time.monotonic() - t0, f"cannot run {argv[0]}: {exc}")
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
        log.warning("scheduler_command_timeout", argv=argv, timeout_s=timeout_s)
        return CommandResult(
            tuple(argv), None, "", "", time.monotonic() - t0, f"{argv[0]} timed out after {timeout_s}s"
        )
    res = CommandResult(
        tuple(argv),
        proc.returncode,
        out.decode(errors="replace"),
        err.decode(errors="replace"),
        time.monotonic() - t0,
    )
    log.debug("scheduler_command", argv=argv, rc=res.rc, seconds=round(res.seconds, 3))
    return res
