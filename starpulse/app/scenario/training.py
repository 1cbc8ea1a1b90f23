"""Simulated training jobs for scenarios: steps, checkpoints, restarts after a requeue.

A scenario's jobs have no real processes; this model stands in for them at the same
edge the job library does. Each job steps at a fixed rate on the nodes the (simulated)
scheduler gives it, checkpoints every `checkpoint_every_s` and when signalled, and after
a requeue restarts on its new nodes from its last complete checkpoint after a start-up
delay. Its progress reaches the controller's job registry as the `JobStepSample`s the
agents' job collector would carry, so restart, steps-lost and downtime accounting is the
controller's own.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass

from controller.heal.scheduler.sim import SimScheduler
from controller.ingest.registry import NodeRecord
from controller.jobs.registry import JobRegistry
from starpulse.v1 import telemetry_pb2 as tpb

_pids = itertools.count(10_000)


@dataclass
class _Run:
    job: str
    checkpoint_every_s: float
    step: int = 0
    last_checkpoint: int = 0
    last_checkpoint_at: float = 0.0
    restarts_seen: int = 0
    signals_seen: int = 0
    pid: int = 0
    resumed_from: int = 0
    starting_until: float = 0.0  # after a requeue: not stepping until then


class SimTraining:
    def __init__(
        self,
        scheduler: SimScheduler,
        jobs: JobRegistry,
        node_record: Callable[[str], NodeRecord | None],
        checkpoint_every_s: dict[str, float],
        steps_per_s: float = 10.0,
        restart_delay_s: float = 2.0,
        tick_s: float = 0.25,
    ) -> None:
        self.scheduler = scheduler
        self.jobs = jobs
        self.node_record = node_record
        self.steps_per_s = steps_per_s
        self.restart_delay_s = restart_delay_s
        self.tick_s = tick_s
        now = time.monotonic()
        self.runs = {
            name: _Run(name, every, last_checkpoint_at=now, pid=next(_pids))
            for name, every in checkpoint_every_s.items()
        }

    async def run(self, stop: asyncio.Event) -> None:
        last = time.monotonic()
        while not stop.is_set():
            await asyncio.sleep(self.tick_s)
            now = time.monotonic()
            for run in self.runs.values():
                self._advance(run, now, now - last)
            last = now

    def _advance(self, run: _Run, now: float, dt: float) -> None:
        job = self.scheduler.jobs.get(run.job)
        if job is None:
            return
        if job.restarts > run.restarts_seen:  # requeued: the new run starts from the checkpoint
            run.restarts_seen = job.restarts
            run.step = run.last_checkpoint
            run.resumed_from = run.last_checkpoint
            run.pid = next(_pids)
            run.starting_until = now + self.restart_delay_s
        if len(job.signals) > run.signals_seen:  # USR1: checkpoint now
            run.signals_seen = len(job.signals)
            run.last_checkpoint, run.last_checkpoint_at = run.step, now
        if job.state != "running" or now < run.starting_until:
            return
        run.step += max(1, round(dt * self.steps_per_s))
        if run.checkpoint_every_s and now - run.last_checkpoint_at >= run.checkpoint_every_s:
            run.last_checkpoint, run.last_checkpoint_at = run.step, now
        for rank, node in enumerate(job.nodes):
            record = self.node_record(node)
            if record is None:
                continue
            report = tpb.Report(seq=1, timestamp_ms=int(time.time() * 1000))
            report.job_steps.add(
                job=run.job,
                rank=rank,
                step=run.step,
                step_time_s=1.0 / self.steps_per_s,
                last_checkpoint_step=run.last_checkpoint,
                pid=run.pid + rank,
                world_size=len(job.nodes),
                resumed_from_step=run.resumed_from,
            )
            self.jobs.on_report(record, report)
