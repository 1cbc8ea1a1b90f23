"""A real Slurm 22.05 cluster on this host for tests: munged, slurmctld and N slurmd.

Why a harness: the scheduler backend must be checked against real scontrol/sinfo/squeue
behaviour (drain reasons, requeue holds, signals), which no fake reproduces faithfully.
It follows docs/shared services.md: no systemd, every daemon a plain foreground process
on loopback with its own temp folder, ports picked free, SLURM_CONF exported for every
client command, and every process stopped by its PID, even when a test fails.

Needs the Debian packages slurmctld, slurmd, slurm-client and munge; `SlurmCluster`
skips the test (pytest.skip) with that reason when a binary is missing.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import pytest

from tests.helpers import free_ports

BINARIES = ("munged", "slurmctld", "slurmd", "scontrol", "sinfo", "squeue", "sbatch", "scancel")
MISSING_REASON = (
    "Slurm/munge not installed (apt-get install --no-install-recommends slurmctld slurmd slurm-client munge)"
)


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")


def missing_binaries() -> list[str]:
    """Names of the Slurm/munge binaries this host lacks (empty when the harness can run)."""
    return [b for b in BINARIES if _which(b) is None]


REBOOT_SH = r"""#!/bin/bash
# RebootProgram of the test cluster: "reboot" the node whose slurmd runs this, i.e. stop
# that slurmd and start a new one as after a boot. Several slurmd share this host, so the
# node is the one named by the nearest slurmd -N among this script's parents; and the new
# slurmd runs in its own time namespace whose boot time is now, or slurmctld (which waits
# for the node's boot time to pass the reboot request) would never see the reboot end.
pid=$PPID
while [ "$pid" -gt 1 ]; do
  args=$(tr '\0' ' ' < /proc/$pid/cmdline)
  case "$args" in *slurmd*" -N "*) break;; esac
  pid=$(awk '{print $4}' /proc/$pid/stat)
done
node=$(echo "$args" | sed -E 's/.* -N ([^ ]+).*/\1/')
(
  sleep 1; kill -TERM "$pid"; sleep 2
  up=$(cut -d. -f1 /proc/uptime)
  setsid unshare --time --boottime -$((up - 1)) $args >> "@DIR@/log/slurmd-$node-rebooted.out" 2>&1 < /dev/null &
  echo $! > "@DIR@/rebooted-$node.pid"
) > /dev/null 2>&1 < /dev/null &
exit 0
"""


def time_namespace_unavailable() -> str | None:
    """Why ``unshare --time`` cannot run here (it needs root and Linux 5.6+), or None."""
    try:
        done = subprocess.run(
            ["unshare", "--time", "--boottime", "0", "true"], check=False, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return str(err)
    return None if done.returncode == 0 else (done.stderr.strip() or f"exit {done.returncode}")


class SlurmCluster:
    """Context manager: a Slurm controller and `nodes` slurmd (gpu01..) on 127.0.0.1.

    `env` carries SLURM_CONF for client commands; `sbatch`, `sinfo_rows`, `squeue_rows`
    and `job` are the helpers tests use. KillWait is short so a requeued run ends fast.
    """

    def __init__(
        self,
        tmpdir: Path,
        nodes: int = 4,
        partition: str = "gpu",
        start_timeout_s: float = 30.0,
        node_names: list[str] | None = None,
        extra_conf: list[str] | None = None,
        scheduler_parameters: str = "sched_interval=1",
        reboot_program: bool = False,
    ) -> None:
        self.requested_dir = Path(tmpdir)
        self.n = nodes
        self.partition = partition
        self.start_timeout_s = start_timeout_s
        # Names can follow a starpulse fabric (node-000, …) so agents, fabric and Slurm agree.
        self.node_names = node_names or [f"gpu{i:02d}" for i in range(1, nodes + 1)]
        self.n = len(self.node_names)
        self.extra_conf = list(extra_conf or [])  # more slurm.conf lines (Prolog=, PrologFlags=, ...)
        self.scheduler_parameters = scheduler_parameters
        self.reboot_program = reboot_program  # RebootProgram restarts the node's slurmd as after a boot
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.dir = self.requested_dir
        self.conf = self.dir / "slurm.conf"
        self.env: dict[str, str] = {}
        self._own_dir: str | None = None

    # -- lifecycle -----------------------------------------------------------------
    def __enter__(self) -> SlurmCluster:
        missing = missing_binaries()
        if missing:
            pytest.skip(f"{MISSING_REASON}; missing: {', '.join(missing)}")
        if self.reboot_program and (why := time_namespace_unavailable()):
            pytest.skip(f"the RebootProgram harness restarts slurmd in a time namespace: {why}")
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> None:
        # A unix socket path must stay under 108 bytes: pytest's tmp paths can be long.
        d = self.requested_dir / "slurm"
        if len(str(d)) > 60:
            self._own_dir = tempfile.mkdtemp(prefix="sp-slurm-")
            d = Path(self._own_dir)
        self.dir = d
        for sub in ("state", "spool"):
            shutil.rmtree(d / sub, ignore_errors=True)
        for sub in ("munge", "state", "spool", "log"):
            (d / sub).mkdir(parents=True, exist_ok=True)
        for name in self.node_names:
            (d / "spool" / name).mkdir(exist_ok=True)
        # munged refuses a socket folder (or parents) not mode 755-like.
        for p in (d, d / "munge"):
            p.chmod(0o755)
        for parent in list(d.parents)[:4]:
            with contextlib.suppress(OSError):
                if parent.stat().st_mode & 0o777 == 0o700:
                    parent.chmod(0o755)
        key = d / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        sock = d / "munge" / "munge.socket.2"
        ctld_port, slurmd_port, *node_ports = free_ports(2 + self.n)
        self.conf = d / "slurm.conf"
        if self.reboot_program:
            script = d / "reboot.sh"
            script.write_text(REBOOT_SH.replace("@DIR@", str(d)))
            script.chmod(0o755)
            self.extra_conf += [f"RebootProgram={script}", "ResumeTimeout=60"]
        self.conf.write_text(self._conf_text(sock, ctld_port, slurmd_port, node_ports))
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}

        self._spawn(
            "munged",
            [
                _which("munged") or "munged",
                "-F",
                f"--key-file={key}",
                f"--socket={sock}",
                f"--pid-file={d / 'munge' / 'munged.pid'}",
                f"--log-file={d / 'log' / 'munged.log'}",
                f"--seed-file={d / 'munge' / 'munged.seed'}",
            ],
        )
        self._wait(sock.exists, "munged socket")
        self._spawn("slurmctld", [_which("slurmctld") or "slurmctld", "-D", "-c", "-f", str(self.conf)])
        self._wait(lambda: "UP" in self.run("scontrol", "ping", check=False).stdout, "slurmctld UP")
        for name in self.node_names:
            self._spawn(f"slurmd-{name}", [_which("slurmd") or "slurmd", "-D", "-N", name, "-f", str(self.conf)])
        self.wait_idle(self.n, timeout=self.start_timeout_s)

    def _conf_text(self, sock: Path, ctld_port: int, slurmd_port: int, node_ports: list[int]) -> str:
        d = self.dir
        lines = [
            "ClusterName=starpulse",
            "SlurmctldHost=localhost",
            "SlurmUser=root",
            "SlurmdUser=root",
            f"SlurmctldPort={ctld_port}",
            f"SlurmdPort={slurmd_port}",
            "AuthType=auth/munge",
            f"AuthInfo=socket={sock}",
            "CredType=cred/munge",
            f"StateSaveLocation={d / 'state'}",
            f"SlurmdSpoolDir={d / 'spool'}/%n",
            f"SlurmctldPidFile={d / 'slurmctld.pid'}",
            f"SlurmdPidFile={d}/slurmd-%n.pid",
            f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={d / 'log'}/slurmd-%n.log",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "ReturnToService=2",
            "MpiDefault=none",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "SwitchType=switch/none",
            "MailProg=/bin/true",
            "SlurmdTimeout=30",
            # Short waits so a requeued or cancelled run ends within seconds.
            "KillWait=2",
            "MinJobAge=300",
            f"SchedulerParameters={self.scheduler_parameters}",
            *self.extra_conf,
        ]
        for name, port in zip(self.node_names, node_ports, strict=True):
            lines.append(
                f"NodeName={name} NodeHostname=localhost NodeAddr=127.0.0.1 Port={port} "
                "CPUs=1 RealMemory=1000 State=UNKNOWN"
            )
        nodes = ",".join(self.node_names)
        lines.append(f"PartitionName={self.partition} Nodes={nodes} Default=YES MaxTime=INFINITE State=UP")
        return "\n".join(lines) + "\n"

    def _spawn(self, name: str, argv: list[str]) -> None:
        log = open(self.dir / "log" / f"{name}.out", "ab")  # noqa: SIM115 - kept open for the process's life
        try:
            self.procs[name] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=self.env)
        finally:
            log.close()

    def _wait(self, cond: Any, what: str, timeout: float | None = None) -> None:
        deadline = time.monotonic() + (timeout or self.start_timeout_s)
        while not cond():
            dead = {
                n: p.returncode
                for n, p in self.procs.items()
                if p.poll() is not None and not (self.dir / f"rebooted-{n.removeprefix('slurmd-')}.pid").exists()
            }
            if dead:
                raise RuntimeError(f"{what}: process exited early {dead}; logs in {self.dir / 'log'}\n{self.logs()}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out waiting for {what}; logs in {self.dir / 'log'}\n{self.logs()}")
            time.sleep(0.1)

    def logs(self, tail: int = 15) -> str:
        out = []
        for f in sorted((self.dir / "log").glob("*")):
            with contextlib.suppress(OSError):
                lines = f.read_text(errors="replace").splitlines()[-tail:]
                out.append(f"--- {f.name}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """Cancel jobs, then stop every daemon by PID (SIGTERM, then SIGKILL)."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            with contextlib.suppress(Exception):
                self.run("scancel", "--full", "--partition", self.partition, check=False, timeout=10)
                self._wait_quiet(10.0)
        self._stop_rebooted()
        order = [n for n in self.procs if n.startswith("slurmd-")] + ["slurmctld", "munged"]
        for name in order:
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=5)
        self.procs.clear()
        if self._own_dir:
            shutil.rmtree(self._own_dir, ignore_errors=True)
            self._own_dir = None

    def _stop_rebooted(self) -> None:
        """The slurmd processes a RebootProgram started (not children of this harness): by their PID files."""
        for pid_file in self.dir.glob("rebooted-*.pid"):
            with contextlib.suppress(ValueError, OSError):
                pid = int(pid_file.read_text().split()[0])
                os.kill(pid, signal.SIGTERM)
                for _ in range(50):
                    os.kill(pid, 0)  # raises once it is gone
                    time.sleep(0.1)
                os.kill(pid, signal.SIGKILL)
            pid_file.unlink(missing_ok=True)

    def boot_time(self, node: str) -> str:
        """The node's BootTime as slurmctld has it (a reboot moves it on)."""
        fields = dict(
            w.split("=", 1) for w in self.run("scontrol", "-o", "show", "node", node).stdout.split() if "=" in w
        )
        return fields.get("BootTime", "")

    def _wait_quiet(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not self.run("squeue", "-h", "-o", "%i", check=False, timeout=5).stdout.strip():
                return
            time.sleep(0.2)

    # -- client helpers ------------------------------------------------------------
    def run(self, *argv: str, check: bool = True, timeout: float = 20.0) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command with SLURM_CONF set (no shell)."""
        return subprocess.run(list(argv), env=self.env, capture_output=True, text=True, check=check, timeout=timeout)

    def wait_idle(self, n: int, timeout: float = 30.0) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "-h", "-t", "idle", "-o", "%D", check=False).stdout.strip()
            return out.isdigit() and int(out) >= n

        self._wait(idle, f"{n} idle nodes", timeout)

    def sbatch(
        self,
        script: str | Path,
        nodes: int = 1,
        nodelist: list[str] | None = None,
        exclude: list[str] | None = None,
        job_name: str = "train",
        output: Path | None = None,
        extra: list[str] | None = None,
    ) -> str:
        """Submit a batch script (a path, or shell text written to a file); return the job id."""
        path = Path(script) if isinstance(script, Path) else None
        if path is None:
            path = self.dir / f"job-{time.monotonic_ns()}.sh"
            path.write_text(str(script))
            path.chmod(0o755)
        argv = ["sbatch", "--parsable", f"--nodes={nodes}", f"--job-name={job_name}", "--requeue"]
        if nodelist:
            argv.append(f"--nodelist={','.join(nodelist)}")
        if exclude:
            argv.append(f"--exclude={','.join(exclude)}")
        if output:
            argv += [f"--output={output}", "--open-mode=append"]
        argv += extra or []
        argv.append(str(path))
        out = self.run(*argv).stdout.strip()
        return out.split(";")[0]

    def sinfo_rows(self) -> list[dict[str, str]]:
        """One row per node: node, state, reason (from `sinfo -N -o "%N|%T|%E"`)."""
        out = self.run("sinfo", "-N", "-h", "-o", "%N|%T|%E").stdout
        rows = []
        for line in out.splitlines():
            node, state, reason = [*line.split("|", 2), "", ""][:3]
            rows.append({"node": node, "state": state, "reason": reason})
        return rows

    def squeue_rows(self) -> list[dict[str, Any]]:
        """Jobs as `squeue --json` reports them."""
        data = json.loads(self.run("squeue", "--json").stdout)
        return list(data.get("jobs", []))

    def job(self, job_id: str) -> dict[str, str]:
        """Key=value fields from `scontrol -o show job <id>`."""
        out = self.run("scontrol", "-o", "show", "job", job_id).stdout
        fields: dict[str, str] = {}
        for tok in out.split():
            k, sep, v = tok.partition("=")
            if sep:
                fields[k] = v
        return fields
