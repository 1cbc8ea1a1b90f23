"""GPU compute processes and their Slurm job: NVML's process lists (the fake speaks pynvml's
names and fields) and the job from /proc/PID/cgroup or SLURM_JOB_ID in /proc/PID/environ."""

from __future__ import annotations

from pathlib import Path

from agent.collectors.gpu_procs import GpuProcessCollector, job_of_pid
from agent.sim.fake_nvml import FakeNvml
from starpulse.v1 import telemetry_pb2 as tpb


def _proc(root: Path, pid: int, cgroup: str | None = None, environ: bytes | None = None) -> None:
    folder = root / str(pid)
    folder.mkdir(parents=True)
    if cgroup is not None:
        (folder / "cgroup").write_text(cgroup)
    if environ is not None:
        (folder / "environ").write_bytes(environ)


def test_job_from_cgroup_v1_v2_then_environ_then_nothing(tmp_path: Path) -> None:
    _proc(tmp_path, 11, "12:pids:/slurm/uid_1000/job_4242/step_0/task_3\n1:name=systemd:/slurm/uid_1000/job_4242\n")
    _proc(tmp_path, 12, "0::/system.slice/slurmstepd.scope/job_777/step_0/user/task_0\n")
    _proc(tmp_path, 13, "0::/user.slice/user-1000.slice/session-3.scope\n", b"HOME=/root\0SLURM_JOB_ID=99\0")
    _proc(tmp_path, 14, "0::/user.slice/job_abc/x\n", b"HOME=/root\0")  # job_ without digits: not Slurm's
    assert job_of_pid(str(tmp_path), 11) == ("4242", "cgroup")
    assert job_of_pid(str(tmp_path), 12) == ("777", "cgroup")
    assert job_of_pid(str(tmp_path), 13) == ("99", "environ")
    assert job_of_pid(str(tmp_path), 14) == ("", "")
    assert job_of_pid(str(tmp_path), 15) == ("", "")  # gone: no files at all


def test_collector_lists_each_gpus_processes_with_their_job(tmp_path: Path) -> None:
    nvml = FakeNvml(gpu_count=2, seed=1)
    nvml.nvmlInit()
    _proc(tmp_path, 500, "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n")
    nvml.set_processes(0, [(500, 60 * 1024**3)])
    nvml.set_processes(1, [(501, None)])  # NOT_AVAILABLE memory, a pid we cannot place
    [info] = nvml.nvmlDeviceGetComputeRunningProcesses(nvml.nvmlDeviceGetHandleByIndex(0))
    assert (info.pid, info.usedGpuMemory) == (500, 60 * 1024**3)  # pynvml's field names
    collector = GpuProcessCollector(nvml, str(tmp_path))
    assert collector.supported()
    report = tpb.Report()
    collector.collect(report)
    got = [(p.gpu_index, p.pid, p.used_memory_bytes, p.job, p.job_source) for p in report.gpu_processes]
    assert got == [(0, 500, 60 * 1024**3, "4242", "cgroup"), (1, 501, 0, "", "")]


def test_collective_stall_holds_the_gpu_busy_at_idle_power() -> None:
    nvml = FakeNvml(gpu_count=1, seed=1)
    nvml.nvmlInit()
    handle = nvml.nvmlDeviceGetHandleByIndex(0)
    busy_power = nvml.nvmlDeviceGetPowerUsage(handle)
    nvml.set_collective_stall(0, True)
    assert nvml.nvmlDeviceGetUtilizationRates(handle).gpu == 100
    assert nvml.nvmlDeviceGetPowerUsage(handle) < 0.2 * nvml.nvmlDeviceGetEnforcedPowerLimit(handle) < busy_power
