"""Hang -> job resumed with real ranks: examples/train_ranks.py processes (a TCP barrier every
step, a checkpoint every ``--checkpoint-every`` steps) under real agent job gateways, a
``DecisionCore`` with its healer on the system clock and the in-memory scheduler
(``SimScheduler``: the job on node-000..003, node-004 and node-005 the hot spares).

    python -m bench.hang --resume [--shape after_barrier|before_barrier|barrier_lost] [--two]

The harness plays the scheduler's other half: when the healer requeues the job (evicted node
excluded and the spare in its place, or in place when nobody is named), it kills the old run's
ranks, as a requeue does, and starts the new run's ranks on the nodes the scheduler placed
them on (two per node), on the same checkpoint directory. The new ranks resume from the newest
checkpoint every rank completed. Measured: hang -> incident, hang -> culprit (named by the steps
at the incident, or by the stacks when they group), hang -> the new run's first step, the step
it resumed from, its first step (must be the checkpoint's + 1) and the steps lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from agent.commands import CommandHandler
from agent.jobs import JobGateway
from bench.hang import ODD_RANK, RANKS_PER_NODE, TRAIN, _agent_commands, _free_port, report_ranks
from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.jobs.hang import HangConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig, HealSettings
from controller.store import Store
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb

JOB = "llm"
POLL_S = 0.1  # how often the harness looks for a requeue and the new run's first step


@dataclass
class ResumeRun:
    shape: str
    hang_step: int
    hang_to_incident_s: float = 0.0
    culprit: list[dict[str, Any]] = field(default_factory=list)  # rank/node named (empty: nobody)
    culprit_from: str = ""  # "steps" or "stacks"
    stacks_reason: str = ""  # the stacks' verdict, in words (every rank in one place: nobody named)
    hang_to_culprit_s: float = 0.0
    action: str = ""  # "evict" or "restart_in_place"
    evicted: list[str] = field(default_factory=list)
    requeues: int = 0  # one per eviction: two suspects, two requeues (the second on the final nodes)
    requeued_on: list[str] = field(default_factory=list)
    hang_to_resumed_s: float = 0.0  # to the new run's first step
    incident_to_resumed_s: float = 0.0
    resumed_from_step: int = -1
    first_step_after_resume: int = -1
    last_step_before_hang: int = 0
    steps_lost: int = 0  # the registry's count (one interruption per requeue: two suspects count twice)
    steps_redone: int = 0  # what the job really does again: last step reached - the step it resumed from
    decisions: list[dict[str, Any]] = field(default_factory=list)  # the healer's, for this hang

    def to_dict(self) -> dict[str, Any]:
        return {k: round(v, 2) if isinstance(v, float) else v for k, v in asdict(self).items()}


class Ranks:
    """One run of the job: two ranks per node, their stdout lines read with the time they arrived."""

    def __init__(self) -> None:
        self.procs: list[asyncio.subprocess.Process] = []
        self.readers: list[asyncio.Task[None]] = []
        self.hang_at: float | None = None
        self.resumed_from: int | None = None
        self.first_step: tuple[int, float] | None = None  # (step, when every rank had done it)
        self.max_step = 0
        self._firsts: dict[int, tuple[int, float]] = {}

    async def start(self, nodes: list[str], gateways: dict[str, JobGateway], workdir: Path, args: list[str]) -> None:
        world = len(nodes) * RANKS_PER_NODE
        port = _free_port()
        for rank in range(world):
            gw = gateways[nodes[rank // RANKS_PER_NODE]]
            proc = await asyncio.create_subprocess_exec(
                sys.executable, str(TRAIN), "--job", JOB, "--rank", str(rank), "--world-size", str(world),
                "--rendezvous", f"127.0.0.1:{port}", "--steps", "100000", "--checkpoint-dir", str(workdir / "ck"),
                "--socket", gw.socket_path, *args,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            self.procs.append(proc)
            self.readers.append(asyncio.create_task(self._read(rank, proc, world)))

    async def _read(self, rank: int, proc: asyncio.subprocess.Process, world: int) -> None:
        assert proc.stdout is not None
        async for raw in proc.stdout:
            words = raw.decode().split()
            if words[:1] == ["hang"] and self.hang_at is None:
                self.hang_at = float(words[-1].split("=", 1)[1])
            elif words[:2] == ["resumed", "from"]:
                self.resumed_from = int(words[-1])
            elif words[:1] == ["fresh"]:
                self.resumed_from = 0
            elif words[:1] == ["step"]:
                step = int(words[1])
                self.max_step = max(self.max_step, step)
                if rank not in self._firsts:
                    self._firsts[rank] = (step, float(words[2].split("=", 1)[1]))
                    if len(self._firsts) == world:
                        steps, times = zip(*self._firsts.values(), strict=True)
                        self.first_step = (min(steps), max(times))

    async def kill(self) -> None:
        for proc in self.procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        for task in self.readers:
            task.cancel()


async def run_resume(
    workdir: Path,
    shape: str = "after_barrier",
    step_time_s: float = 0.2,
    hang_step: int = 40,
    checkpoint_every: int = 10,
    report_s: float = 1.0,
    floor_s: float = 3.0,
    timeout_s: float = 120.0,
    odd_ranks: tuple[int, ...] = (ODD_RANK,),
    max_fleet_share: float = 0.05,
) -> ResumeRun:
    """One job on four nodes hangs at ``hang_step``; detected, decided, acted on, resumed.

    ``max_fleet_share``: the guard's share of the fleet out at once. Its default lets one node of
    these six go (at least one is always allowed): two suspects need 0.34, as the demo's 2 of 17.
    """
    fabric = generate_fabric(nodes=4, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1, spares=2)
    nodes = sorted(fabric.nodes())
    job_nodes = [n for n in nodes if n not in fabric.spares()]
    scheduler = SimScheduler(nodes)
    scheduler.add_job(JOB, job_nodes)
    config = ControllerConfig(
        db_path=workdir / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=1.0)),
        hang=HangConfig(every_s=0.5, floor_s=floor_s, signal_lost_s=10 * report_s),
        heal=HealSettings(
            scheduler=scheduler,
            guards=GuardConfig(mode="enforce", max_fleet_share=max_fleet_share),
            heal=HealConfig(checkpoint_timeout_s=0.0),
        ),
    )
    store = Store(config.db_path)
    core = DecisionCore(config, SYSTEM_CLOCK, store, ControllerMetrics(), fabric=fabric)
    gateways: dict[str, JobGateway] = {}
    for node in nodes:
        gw = gateways[node] = JobGateway(str(workdir / node / "jobs.sock"), stale_after_s=3600)
        await gw.start()
        inv = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(2)])
        core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inv, boot_id="b"))
    agents = [asyncio.create_task(_agent_commands(core, n, CommandHandler(gw))) for n, gw in gateways.items()]
    core.start()
    hang_args = [
        "--step-time", str(step_time_s), "--checkpoint-every", str(checkpoint_every),
        "--hang-rank", ",".join(map(str, odd_ranks)), "--hang-step", str(hang_step), "--hang-where", shape,
    ]  # fmt: skip
    first = Ranks()
    runs = [first]
    await first.start(job_nodes, gateways, workdir, hang_args)
    run = ResumeRun(shape=shape, hang_step=hang_step)
    opened_ms: int | None = None
    seq = 0
    deadline = time.monotonic() + timeout_s
    next_report = time.monotonic() + report_s
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)  # the harness looks often; the agents report every report_s
            if time.monotonic() >= next_report:
                next_report += report_s
                seq += 1
                report_ranks(core, gateways, seq)
            hangs = [i for i in core.detection.correlator.incidents() if i.kind == "job_hang"]
            if hangs and opened_ms is None and first.hang_at is not None:
                opened_ms = hangs[0].opened_ms
                run.hang_to_incident_s = opened_ms / 1000.0 - first.hang_at
            active = [c for c in core.hangs.active() if c.evidence.get("job") == JOB]
            if active and "stacks" in active[0].evidence and not run.stacks_reason:
                run.stacks_reason = str(active[0].evidence["stacks"].get("reason", ""))
            if active and not run.culprit_from and first.hang_at is not None:
                ev = active[0].evidence
                if ev.get("step_suspects"):
                    run.culprit, run.culprit_from = list(ev["step_suspects"]), "steps"
                    run.hang_to_culprit_s = time.time() - first.hang_at if opened_ms is None else run.hang_to_incident_s
                elif "stacks" in ev:
                    run.culprit_from = "stacks"
                    run.culprit = [{"rank": s["rank"], "node": s["node"]} for s in ev.get("suspects") or []]
                    run.hang_to_culprit_s = ev["stacks"]["at_ms"] / 1000.0 - first.hang_at
            requeues = [a for a in scheduler.actions if a[0] == "requeue"]
            if len(requeues) > len(runs) - 1:  # a requeue (two suspects: one per eviction) ends the run
                run.requeued_on = requeues[-1][2].split(",")
                run.requeues = len(requeues)
                run.last_step_before_hang = max(run.last_step_before_hang, first.max_step)
                drained = {a[1] for a in scheduler.actions if a[0] == "drain"}
                run.action = "evict" if drained else "restart_in_place"
                run.evicted = sorted(drained)
                await runs[-1].kill()
                runs.append(Ranks())
                await runs[-1].start(run.requeued_on, gateways, workdir, ["--step-time", str(step_time_s)])
            current = runs[-1]
            if len(runs) > 1 and current.first_step is not None and first.hang_at is not None and opened_ms is not None:
                run.first_step_after_resume, at = current.first_step
                run.resumed_from_step = current.resumed_from if current.resumed_from is not None else -1
                run.hang_to_resumed_s = at - first.hang_at
                run.incident_to_resumed_s = at - opened_ms / 1000.0
                rec = core.jobs.job(JOB)
                run.steps_lost = rec.steps_lost if rec is not None else -1
                run.steps_redone = run.last_step_before_hang - run.resumed_from_step
                assert core.healer is not None
                run.decisions = [
                    {k: d.get(k) for k in ("action", "node", "outcome", "reason")}
                    for d in core.healer.decisions
                    if d.get("kind") == "job_hang"
                ]
                return run
        raise TimeoutError(f"not resumed within {timeout_s:g}s: {run.to_dict()} actions={scheduler.actions}")
    finally:
        for ranks in runs:
            await ranks.kill()
        for task in agents:
            task.cancel()
        await core.stop()
        await core.stop_healing()
        for gw in gateways.values():
            await gw.close()
        store.close()


async def run_healthy(
    workdir: Path, seconds: float, step_time_s: float = 0.2, report_s: float = 5.0, floor_s: float = 20.0
) -> dict[str, Any]:
    """Real ranks that train healthily for ``seconds`` (checkpoints every 50 steps, a 30 s
    evaluation pass every 300 steps, rank 2 a straggler at 2.5 x the step time) under the same
    controller: the ``job_hang`` incidents it opens (goal: 0) and the steps trained."""
    fabric = generate_fabric(nodes=4, gpus_per_node=2, rails=2, nodes_per_block=4, spines=1, spares=2)
    nodes = sorted(fabric.nodes())
    job_nodes = [n for n in nodes if n not in fabric.spares()]
    config = ControllerConfig(
        db_path=workdir / "c.db",
        fabric=fabric,
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=1.0)),
        hang=HangConfig(every_s=0.5, floor_s=floor_s, signal_lost_s=10 * report_s),
    )
    store = Store(config.db_path)
    core = DecisionCore(config, SYSTEM_CLOCK, store, ControllerMetrics(), fabric=fabric)
    gateways: dict[str, JobGateway] = {}
    for node in nodes:
        gw = gateways[node] = JobGateway(str(workdir / node / "jobs.sock"), stale_after_s=3600)
        await gw.start()
        core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory(), boot_id="b"))
    ranks = Ranks()
    await ranks.start(job_nodes, gateways, workdir, [
        "--step-time", str(step_time_s), "--checkpoint-every", "50", "--eval-every", "300", "--eval-s", "30",
        "--slow-rank", "2", "--slow-factor", "2.5",
    ])  # fmt: skip
    seq = 0
    end = time.monotonic() + seconds
    try:
        while time.monotonic() < end:
            await asyncio.sleep(report_s)
            seq += 1
            report_ranks(core, gateways, seq)
        hangs = [i for i in core.detection.correlator.incidents(active_only=False) if i.kind == "job_hang"]
        return {"seconds": seconds, "job_hang_incidents": len(hangs), "steps_trained": ranks.max_step}
    finally:
        await ranks.kill()
        await core.stop()
        for gw in gateways.values():
            await gw.close()
        store.close()
