"""Which processes compute on which GPU, and which scheduler job each belongs to.

What the controller needs to see a hang without the job's help (``controller.jobs.stall``):
a job's GPUs. The accelerator backend says which processes run on a GPU (NVML's
``nvmlDeviceGetComputeRunningProcesses``: pid and ``usedGpuMemory``); the scheduler says
which job a process is, read here from what it leaves on the process, in this order:

1. ``/proc/PID/cgroup``: Slurm's cgroup plugin puts every task of a job under a ``job_<id>``
   folder (v1: ``/slurm/uid_1000/job_4242/step_0/task_0``; v2:
   ``/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0``). Readable for any pid.
2. ``/proc/PID/environ``: ``SLURM_JOB_ID`` (srun/sbatch set it for every task). Readable
   only with the process's uid or CAP_SYS_PTRACE (the agent's unit grants it).

When neither answers (not a Slurm job, a pid that ended, no right to read), the process is
reported with an empty ``job``: the controller then cannot tell which job those GPUs serve
and judges them for nobody (no hang verdict is made from GPUs of no known job). Answers are
cached per pid: a job does not change its cgroup.
"""

from __future__ import annotations

import re
from typing import Any

import structlog

from starpulse.core.findings import Finding
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

_CGROUP_JOB = re.compile(r"/job_(\d+)(?:/|$)")
_CACHE_MAX = 4096


def job_of_pid(procfs: str, pid: int) -> tuple[str, str]:
    """(job id, source) for ``pid``: ("4242", "cgroup"), ("4242", "environ") or ("", "")."""
    try:
        with open(f"{procfs}/{pid}/cgroup", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                m = _CGROUP_JOB.search(line.rstrip("\n").split(":", 2)[-1])
                if m:
                    return m.group(1), "cgroup"
    except OSError:
        pass
    try:
        with open(f"{procfs}/{pid}/environ", "rb") as fh:
            for entry in fh.read().split(b"\0"):
                if entry.startswith(b"SLURM_JOB_ID="):
                    value = entry.split(b"=", 1)[1].decode("ascii", "replace").strip()
                    if value:
                        return value, "environ"
    except OSError:
        pass
    return "", ""


class GpuProcessCollector:
    """``Report.gpu_processes`` from NVML's compute-process lists and the processes' Slurm job."""

    name = "gpu_processes"

    def __init__(self, nvml: Any, procfs: str = "/proc") -> None:
        self._nvml = nvml
        self._procfs = procfs
        self._jobs: dict[int, tuple[str, str]] = {}
        self._warned = False

    def supported(self) -> bool:
        return hasattr(self._nvml, "nvmlDeviceGetComputeRunningProcesses")

    def describe(self, inventory: ipb.Inventory) -> None:
        return None

    def collect(self, report: tpb.Report) -> list[Finding]:
        nvml = self._nvml
        seen: set[int] = set()
        for index in range(nvml.nvmlDeviceGetCount()):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                procs = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
            except nvml.NVMLError as err:
                if not self._warned:
                    log.info("gpu_processes_unreadable", gpu=index, error=str(err))
                    self._warned = True
                continue
            for p in procs:
                pid = int(p.pid)
                seen.add(pid)
                job = self._jobs.get(pid)
                if job is None:
                    job = job_of_pid(self._procfs, pid)
                    if len(self._jobs) >= _CACHE_MAX:
                        self._jobs.clear()
                    self._jobs[pid] = job
                report.gpu_processes.add(
                    gpu_index=index,
                    pid=pid,
                    used_memory_bytes=int(p.usedGpuMemory or 0),
                    job=job[0],
                    job_source=job[1],
                )
        for pid in [p for p in self._jobs if p not in seen]:
            del self._jobs[pid]  # a pid that left: it may be reused by another job
        return []

    def pids_of(self, job: str) -> list[tuple[int, int]]:
        """(rank, pid) of the processes of Slurm job ``job`` seen on this node's GPUs last cycle;
        the rank from ``SLURM_PROCID`` where the environment says it, else -1."""
        out = []
        for pid, (name, _) in list(self._jobs.items()):
            if name == job:
                out.append((_procid(self._procfs, pid), pid))
        return sorted(out)

    def close(self) -> None:
        return None


def _procid(procfs: str, pid: int) -> int:
    try:
        with open(f"{procfs}/{pid}/environ", "rb") as fh:
            for entry in fh.read().split(b"\0"):
                if entry.startswith(b"SLURM_PROCID="):
                    return int(entry.split(b"=", 1)[1])
    except (OSError, ValueError):
        pass
    return -1
