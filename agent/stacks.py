"""COMMAND_KIND_COLLECT_STACKS: the Python stacks of a job's ranks on this node, and where the
job enables it, the NCCL flight recorder's last collective of each rank.

Stacks come from ``py-spy dump --json --pid PID`` (py-spy reads another process's memory:
the agent's unit grants ``CAP_SYS_PTRACE``). py-spy is used where installed; without it the
answer says so in one line and carries no stacks (hang detection does not need them: they
only name who stalled it). The ranks are the ones registered with this node's job gateway.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from agent.flightrec import UnsafeDump, dump_rank, last_collective
from agent.jobs import JobGateway

log = structlog.get_logger(__name__)

MAX_FRAMES = 64


def find_py_spy(configured: str | None = None) -> str | None:
    """The py-spy executable: ``configured`` when given, else the one on PATH, else the one
    installed beside this interpreter (an agent in a virtual environment whose bin is not on
    PATH); None: not installed."""
    beside = Path(sys.executable).parent / "py-spy"
    return configured or shutil.which("py-spy") or (str(beside) if beside.is_file() else None)


def main_thread_frames(dump: Any, pid: int) -> list[dict[str, Any]]:
    """The main thread's frames (innermost first) from ``py-spy dump --json``: the thread whose
    OS id is the pid, else the first listed."""
    threads = [t for t in dump if isinstance(t, dict)] if isinstance(dump, list) else []
    if not threads:
        return []
    main = next((t for t in threads if t.get("os_thread_id") == pid), threads[0])
    frames = []
    for f in (main.get("frames") or [])[:MAX_FRAMES]:
        if isinstance(f, dict):
            frames.append(
                {"name": str(f.get("name", "")), "file": str(f.get("short_filename") or ""), "line": f.get("line")}
            )
    return frames


async def py_spy_dump(py_spy: str, pid: int, timeout_s: float) -> tuple[list[dict[str, Any]], str]:
    """(frames, error) for one process; frames empty with the reason when py-spy could not read it."""
    try:
        proc = await asyncio.create_subprocess_exec(
            py_spy,
            "dump",
            "--json",
            "--pid",
            str(pid),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as exc:
        return [], f"cannot run {py_spy}: {exc}"
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout_s)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return [], f"py-spy timed out after {timeout_s:g}s"
    if proc.returncode != 0:
        line = err.decode(errors="replace").strip().splitlines()
        return [], f"py-spy exited {proc.returncode}: {line[0] if line else ''}".rstrip(": ")
    try:
        return main_thread_frames(json.loads(out), pid), ""
    except ValueError as exc:
        return [], f"py-spy output is not JSON: {exc}"


class StackCollector:
    """Answers COLLECT_STACKS for the ranks of one job registered with this node's gateway."""

    def __init__(
        self,
        gateway: JobGateway | None,
        py_spy: str | None = None,
        timeout_s: float = 10.0,
        job_pids: Callable[[str], list[tuple[int, int]]] | None = None,
    ) -> None:
        """``job_pids``: (rank, pid) of a scheduler job's GPU processes here (a job without the job
        library, known by its Slurm id: ``GpuProcessCollector.pids_of``)."""
        self.gateway = gateway
        self.job_pids = job_pids
        self.py_spy = find_py_spy(py_spy)
        self.timeout_s = timeout_s
        self._said_missing = False

    async def collect(self, job: str) -> tuple[bool, str, dict[str, Any]]:
        """(ok, one-line message, payload) for ``job``'s ranks on this node."""
        ranks = [(r.rank, r.pid) for r in self.gateway.ranks() if r.job == job and r.pid > 0] if self.gateway else []
        if not ranks and self.job_pids is not None:
            ranks = self.job_pids(job)  # no job library: the job's GPU processes, by its Slurm id
        if not ranks:
            return False, f"no ranks of job {job!r} on this node", {}
        payload: dict[str, Any] = {"job": job, "py_spy": bool(self.py_spy), "ranks": []}
        if self.py_spy is None and not self._said_missing:
            log.warning("py_spy_missing", detail="py-spy is not installed: hangs are detected, culprits not named")
            self._said_missing = True
        results = await asyncio.gather(*(self._one(rank, pid) for rank, pid in ranks))
        payload["ranks"] = list(results)
        got = sum(1 for r in results if r["frames"])
        if self.py_spy is None:
            return True, f"py-spy not installed: no stacks for {len(ranks)} rank(s)", payload
        return True, f"stacks of {got}/{len(ranks)} rank(s) of {job}", payload

    async def _one(self, rank: int, pid: int) -> dict[str, Any]:
        out: dict[str, Any] = {"rank": rank, "pid": pid, "frames": [], "error": ""}
        if self.py_spy is not None:
            out["frames"], out["error"] = await py_spy_dump(self.py_spy, pid, self.timeout_s)
        try:
            dump = await asyncio.to_thread(dump_rank, pid, rank)
        except UnsafeDump as exc:
            out["flight_recorder_error"] = str(exc)
            dump = None
        if dump is not None:
            out["last_collective"] = last_collective(dump)
        return out
