"""The demo's training job: real ``starpulse.app.train`` processes, one per rank, on the
nodes the (in-memory) scheduler gives the job, each talking to its node's agent through
that agent's job socket.

Why real processes: the story the demo tells ends with "the job resumed at its last
checkpoint step", and that is only true when something checkpoints, dies and resumes. The
ranks here are the job library end to end (``starpulse.job``): they report steps and
checkpoints to their agent, the agent carries them to the controller's job registry, the
healer's checkpoint request reaches them over the socket (or as SIGUSR1, the scheduler's
signal), and a requeued run resumes from the newest checkpoint every rank completed.

This module is the scheduler's launcher, nothing more: when the job's placement changes
(a requeue, a run that went pending and came back) the old ranks are stopped (SIGTERM:
they checkpoint and exit, as under Slurm's requeue) and new ones start on the new nodes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from controller.heal.scheduler.sim import SimScheduler

log = structlog.get_logger(__name__)

RANK_MODULE = "starpulse.app.train"  # the rank script, shipped in the package: every install trains
_PACKAGE_ROOT = str(Path(__file__).resolve().parents[2])  # where ``starpulse`` is imported from


def rank_env() -> dict[str, str]:
    """The ranks' environment: this process's, with the starpulse it runs importable first
    (a checkout run without an install, or a wheel's site-packages: the same package)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_PACKAGE_ROOT, env.get("PYTHONPATH", "")) if p)
    return env


@dataclass(frozen=True)
class TrainingConfig:
    """How the demo's ranks train: fast steps, a checkpoint every few seconds."""

    step_time_s: float = 0.5  # a step every half second: 16 ranks cost little CPU
    checkpoint_every: int = 10  # steps: a checkpoint every 5 s, so a fault loses at most ~5 s of work
    stop_timeout_s: float = 5.0  # SIGTERM's grace (the rank checkpoints), then SIGKILL


@dataclass
class Launch:
    """One placement of the job: its ranks' processes, and when it was started."""

    nodes: list[str]
    restarts: int
    procs: list[asyncio.subprocess.Process] = field(default_factory=list)


class DemoTraining:
    """Keeps ``job``'s ranks running where the scheduler placed it."""

    def __init__(
        self,
        scheduler: SimScheduler,
        job: str,
        socket_of: Callable[[str], str],
        workdir: Path,
        config: TrainingConfig | None = None,
        tick_s: float = 0.5,
    ) -> None:
        self.scheduler = scheduler
        self.job = job
        self.socket_of = socket_of
        self.checkpoint_dir = workdir / "checkpoints" / job
        self.log_dir = workdir / "ranks"
        self.config = config or TrainingConfig()
        self.tick_s = tick_s
        self.launches: list[Launch] = []
        self._current: Launch | None = None
        self._signals_seen = 0

    async def run(self, stop: asyncio.Event) -> None:
        """Follow the scheduler's placement until ``stop``; the ranks are stopped on the way out."""
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        try:
            while not stop.is_set():
                await self._follow()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self.tick_s)
        finally:
            await self._stop_ranks()

    async def _follow(self) -> None:
        sim_job = self.scheduler.jobs.get(self.job)
        if sim_job is None:
            return
        running = sim_job.state == "running" and bool(sim_job.nodes)
        placement = (list(sim_job.nodes), sim_job.restarts)
        cur = self._current
        if cur is not None and (not running or (cur.nodes, cur.restarts) != placement):
            await self._stop_ranks()
            cur = None
        if cur is None and running:
            await self._start_ranks(*placement)
        if len(sim_job.signals) > self._signals_seen:  # the scheduler's USR1: checkpoint now
            self._signals_seen = len(sim_job.signals)
            self._signal_all(signal.SIGUSR1)

    async def _start_ranks(self, nodes: list[str], restarts: int) -> None:
        launch = Launch(nodes, restarts)
        cfg = self.config
        for rank, node in enumerate(nodes):
            out = (self.log_dir / f"{self.job}-r{restarts}-rank{rank}.log").open("ab")
            try:
                proc = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", RANK_MODULE, "--job", self.job, "--steps", str(10**9),
                    "--step-time", f"{cfg.step_time_s:g}", "--checkpoint-dir", str(self.checkpoint_dir),
                    "--checkpoint-every", str(cfg.checkpoint_every), "--rank", str(rank),
                    "--world-size", str(len(nodes)), "--socket", self.socket_of(node),
                    stdout=out, stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL, env=rank_env(),
                )  # fmt: skip
            finally:
                out.close()
            launch.procs.append(proc)
        self._current = launch
        self.launches.append(launch)
        log.info("demo_training_started", job=self.job, nodes=nodes, restarts=restarts)

    def _signal_all(self, signum: int) -> None:
        for proc in self._current.procs if self._current else []:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signum)

    async def _stop_ranks(self) -> None:
        cur, self._current = self._current, None
        if cur is None:
            return
        for proc in cur.procs:
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.terminate()
        for proc in cur.procs:
            try:
                await asyncio.wait_for(proc.wait(), self.config.stop_timeout_s)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await proc.wait()
        log.info("demo_training_stopped", job=self.job, nodes=cur.nodes)
