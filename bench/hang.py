"""Hang -> incident with real ranks: examples/train_ranks.py processes that wait on each other
in a TCP barrier every step, registered with real agent job gateways (unix sockets), their
reports decided by a DecisionCore on the system clock.

    python -m bench.hang [--shape after_barrier|before_barrier] [--two] [--step-time 0.2] [--runs 3]
    python -m bench.hang --resume [--shape after_barrier|before_barrier|barrier_lost] [--two]
    python -m bench.hang --false-hangs [--seeds 5] [--minutes 30]
    python -m bench.hang --healthy-s 600     (real ranks, healthy: job_hang incidents, goal 0)

``--resume``: on to the end, through the healer, the in-memory scheduler's requeue and the new
run's first step from the checkpoint (``bench/hang_resume.py``).

Four "nodes" (one JobGateway each) with two ranks each. At ``--hang-step`` rank 3 (node-001)
(and with ``--two`` also rank 6, node-003: two suspects on two nodes)
spins in ``stuck_in_data_loader``: after the barrier (its peers finish the step and wait in the
next one: it is one step behind and is named) or before it (everyone waits at the same step:
nobody is named by the steps). Prints, per run, the seconds from the rank's hang to the
``job_hang`` incident (the rank prints the time it starts to spin), the bound the detector used,
whom the steps named, and then, from the agents' real command handlers (COLLECT_STACKS: real
``py-spy dump`` of the real ranks, where py-spy is on PATH), the seconds from the incident to the
stacks grouped and whom they named.

Reports every ``--report-s`` (default 1 s); hang check every 0.5 s; the training bound is
clamp(5 x median step, floor, 300 s) with ``--floor-s`` (default 3 s, the production default is
20 s: the measured figure is the bound plus what this harness adds, report interval and check).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.commands import CommandHandler
from agent.jobs import JobCollector, JobGateway
from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.jobs.hang import HangConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

TRAIN = Path(__file__).resolve().parent.parent / "examples" / "train_ranks.py"
NODES = ("node-000", "node-001", "node-002", "node-003")
RANKS_PER_NODE = 2
ODD_RANK = 3  # on node-001
SECOND_ODD_RANK = 6  # on node-003 (--two: two suspects on two nodes)


@dataclass
class HangRun:
    shape: str
    hang_step: int
    hang_to_incident_s: float
    bound_s: float
    suspects: list[dict[str, Any]]  # from the steps, at the incident
    incident_shape: str
    incident_to_stacks_s: float | None = None  # None: stacks not awaited or never grouped
    stack_suspects: list[dict[str, Any]] | None = None
    stacks_reason: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "shape": self.shape,
            "hang_step": self.hang_step,
            "hang_to_incident_s": round(self.hang_to_incident_s, 2),
            "bound_s": self.bound_s,
            "suspects": self.suspects,
            "incident_shape": self.incident_shape,
            "incident_to_stacks_s": None if self.incident_to_stacks_s is None else round(self.incident_to_stacks_s, 2),
            "stack_suspects": self.stack_suspects,
            "stacks_reason": self.stacks_reason,
        }


def report_ranks(core: DecisionCore, gateways: dict[str, JobGateway], seq: int) -> None:
    """One report interval: every node's agent sends its ranks' samples, then the core ticks."""
    for node, gw in gateways.items():
        report = tpb.Report(seq=seq, timestamp_ms=int(time.time() * 1000))
        JobCollector(gw).collect(report)
        core.report(node, report)
    core.tick()


async def _agent_commands(core: DecisionCore, node: str, handler: CommandHandler) -> None:
    """The node's end of the command stream: each command run by the agent's real handler."""
    record = core.registry.nodes[node]
    while True:
        command = await record.commands.get()
        core.registry.command_result(record, await handler(command))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def run_once(
    workdir: Path,
    shape: str = "after_barrier",
    step_time_s: float = 0.2,
    hang_step: int = 40,
    report_s: float = 1.0,
    floor_s: float = 3.0,
    timeout_s: float = 90.0,
    stacks: bool = True,
    odd_ranks: tuple[int, ...] = (ODD_RANK,),
) -> HangRun:
    """One job of four real ranks on two gateways; rank 3 hangs at ``hang_step``; the incident it opens."""
    config = ControllerConfig(
        db_path=workdir / "c.db",
        heartbeat_timeout_s=3600.0,
        detection=DetectionConfig(correlation=CorrelationConfig(settle_s=1.0)),
        hang=HangConfig(every_s=0.5, floor_s=floor_s, signal_lost_s=10 * report_s),
    )
    core = DecisionCore(config, SYSTEM_CLOCK, Store(config.db_path), ControllerMetrics())
    gateways: dict[str, JobGateway] = {}
    for node in NODES:
        gw = gateways[node] = JobGateway(str(workdir / node / "jobs.sock"), stale_after_s=3600)
        await gw.start()
        core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory(), boot_id="b"))
    port = _free_port()
    world = len(NODES) * RANKS_PER_NODE
    procs = []
    for rank in range(world):
        node = NODES[rank // RANKS_PER_NODE]
        procs.append(
            await asyncio.create_subprocess_exec(
                sys.executable, str(TRAIN), "--job", "llm", "--rank", str(rank), "--world-size", str(world),
                "--rendezvous", f"127.0.0.1:{port}", "--steps", "100000", "--step-time", str(step_time_s),
                "--checkpoint-dir", str(workdir / "ck"), "--socket", gateways[node].socket_path,
                "--hang-rank", ",".join(map(str, odd_ranks)), "--hang-step", str(hang_step), "--hang-where", shape,
                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
            )
        )  # fmt: skip
    hang_at: list[float] = []

    async def watch_odd() -> None:
        stream = procs[odd_ranks[0]].stdout
        assert stream is not None
        async for line in stream:
            text = line.decode()
            if text.startswith("hang "):
                hang_at.append(float(text.rsplit("at=", 1)[1]))

    watcher = asyncio.create_task(watch_odd())
    agents = [asyncio.create_task(_agent_commands(core, n, CommandHandler(gw))) for n, gw in gateways.items()]
    run: HangRun | None = None
    seq = 0
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(report_s)
            seq += 1
            report_ranks(core, gateways, seq)
            hangs = [i for i in core.detection.correlator.incidents() if i.kind == "job_hang"]
            if hangs and hang_at and run is None:
                cond = core.hangs.active()[0]
                run = HangRun(
                    shape=shape,
                    hang_step=hang_step,
                    hang_to_incident_s=hangs[0].opened_ms / 1000.0 - hang_at[0],
                    bound_s=float(cond.evidence["bound_s"]),
                    suspects=list(cond.evidence["step_suspects"]),
                    incident_shape=str(cond.evidence["shape"]),
                )
                if not stacks:
                    return run
            if run is not None and core.hangs.active() and "stacks" in core.hangs.active()[0].evidence:
                ev = core.hangs.active()[0].evidence
                # Stacks grouped before the incident opened (its grouping window) count as at once.
                run.incident_to_stacks_s = max(0.0, (ev["stacks"]["at_ms"] - hangs[0].opened_ms) / 1000.0)
                run.stack_suspects = [s for s in ev["suspects"]] if ev.get("suspects_from") == "stacks" else []
                run.stacks_reason = str(ev["stacks"]["reason"])
                return run
        raise TimeoutError(f"no job_hang incident within {timeout_s:g}s (hang seen: {bool(hang_at)})")
    finally:
        watcher.cancel()
        for task in agents:
            task.cancel()
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
        for gw in gateways.values():
            await gw.close()


async def _main(args: argparse.Namespace) -> None:
    if args.false_hangs:
        from dataclasses import asdict

        from bench.hang_false import run_seeds

        found = run_seeds(args.seeds, args.minutes)
        for r in found:
            print(json.dumps(asdict(r)), flush=True)
        print(json.dumps({"false_hangs": sum(r.job_hang_incidents for r in found), "seeds": len(found),
                          "minutes": args.minutes}))  # fmt: skip
        return
    if args.healthy_s:
        from bench.hang_resume import run_healthy

        with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
            print(json.dumps(await run_healthy(Path(d), args.healthy_s)))
        return
    if args.resume:
        await _main_resume(args)
        return
    if args.shape == "barrier_lost":
        raise SystemExit("--shape barrier_lost: only with --resume")
    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
            odd = (ODD_RANK, SECOND_ODD_RANK) if args.two else (ODD_RANK,)
            run = await run_once(
                Path(d), args.shape, args.step_time, args.hang_step, args.report_s, args.floor_s, odd_ranks=odd
            )
        runs.append(run.to_dict())
        print(json.dumps(run.to_dict()), flush=True)
    took = sorted(r["hang_to_incident_s"] for r in runs)
    print(json.dumps({"shape": args.shape, "runs": len(runs), "hang_to_incident_s_median": took[len(took) // 2]}))


async def _main_resume(args: argparse.Namespace) -> None:
    from bench.hang_resume import run_resume

    runs = []
    for _ in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="sp-hang-", dir="/tmp") as d:
            odd = (ODD_RANK, SECOND_ODD_RANK) if args.two else (ODD_RANK,)
            run = await run_resume(
                Path(d), args.shape, args.step_time, args.hang_step, args.checkpoint_every, args.report_s,
                args.floor_s, odd_ranks=odd, max_fleet_share=args.fleet_share,
            )  # fmt: skip
        runs.append(run.to_dict())
        print(json.dumps(run.to_dict()), flush=True)
    summary: dict[str, Any] = {"shape": args.shape, "two": args.two, "runs": len(runs)}
    for key in (
        "hang_to_incident_s",
        "hang_to_culprit_s",
        "hang_to_resumed_s",
        "incident_to_resumed_s",
        "steps_lost",
        "steps_redone",
    ):
        values = sorted(r[key] for r in runs)
        summary[f"{key}_median"] = values[len(values) // 2]
    print(json.dumps(summary))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", choices=("after_barrier", "before_barrier", "barrier_lost"), default="after_barrier")
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--hang-step", type=int, default=40)
    p.add_argument("--report-s", type=float, default=1.0)
    p.add_argument("--floor-s", type=float, default=3.0)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--two", action="store_true", help="ranks 3 and 6 (node-001, node-003) hang")
    p.add_argument("--resume", action="store_true", help="on to the job resumed from its checkpoint")
    p.add_argument("--checkpoint-every", type=int, default=10, help="with --resume")
    p.add_argument(
        "--fleet-share",
        type=float,
        default=0.05,
        help="with --resume: the guards' max_fleet_share (two suspects of six nodes: 0.34)",
    )
    p.add_argument("--false-hangs", action="store_true", help="healthy training on the fake clock: job_hang count")
    p.add_argument("--seeds", type=int, default=5, help="with --false-hangs")
    p.add_argument("--healthy-s", type=float, default=0, help="real ranks training healthily this long")
    p.add_argument("--minutes", type=int, default=30, help="with --false-hangs")
    asyncio.run(_main(p.parse_args()))


if __name__ == "__main__":
    main()
