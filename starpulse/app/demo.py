"""`starpulse demo`: a controller and N simulated agents on loopback, with faults on a timer.

Everything here is the real code path (gRPC streams, SQLite, collectors reading fake
NVML and sysfs); only the hardware is simulated. The controller gets a generated fabric
matching the simulated nodes (8 rails, blocks of up to 16 nodes, 4 spines), so its web
dashboard draws the fabric and the faults; the first line printed is the dashboard's
address. It prints what happens as it happens.

The repair loop runs too (issue 19): each evicted node is repaired (the simulated GPU reset
or reboot, ``agent.sim.repairs``), validated (its conditions clear, nothing new for a few
seconds, a burn-in diagnostic run by its agent as a real subprocess) and returned to the
spare pool, or retired. The job trains for real: one ``starpulse.app.train`` per rank (in the package, so every
install trains) on the nodes the in-memory scheduler gives it, each through its node's agent job socket
(``starpulse.app.demo_training``), so it checkpoints, is stopped by a requeue and resumes
from its last complete checkpoint. Faults come at a pace the guards let the cluster absorb
(``DEMO_GUARDS``), every fourth one a leaf switch going down (one switch incident, no
node evicted), the second of every four one only the probe mesh sees (the agents probe
through a drawn rail data plane, ``agent.sim.probe_fabric``: a leaf dropping silently, a
cable losing or slow; one fabric incident, no node evicted), and ``demo over`` ends with
a summary: faults, evictions, nodes repaired and retired, the pool against its target, the
job's time to resume per fault, steps lost and its ETTR.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ParamSpec

import structlog
import yaml

from agent.factory import build_agent
from agent.runtime import AgentConfig
from agent.sim.node import SimNode
from agent.sim.probe_fabric import DrawnProber, SimProbeFabric
from agent.sim.repairs import SimRepairs
from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric, generate_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig, Healer, decision_line
from controller.heal.ladder import RepairPolicy
from controller.heal.policy import default_policy_path
from controller.heal.scheduler.sim import SimScheduler
from controller.ingest.registry import NodeRecord
from controller.ingest.verdict import ReportResult
from controller.jobs.registry import JobRecord
from controller.query.fleet import fleet_report
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.app.cli.progress import status
from starpulse.app.cli.report import report_lines
from starpulse.app.demo_faults import FAULT_EVERY_S, FaultPacer, ScriptedFault
from starpulse.app.demo_training import RANK_MODULE, DemoTraining
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.core.findings import event_kind_name, severity_name
from starpulse.core.logs import configure_logging
from starpulse.v1 import telemetry_pb2 as tpb

P = ParamSpec("P")


class DemoPrinter:
    """Prints what the controller sees (a registry listener)."""

    def __init__(self, t0: float) -> None:
        self.t0 = t0
        self.events = 0

    def stamp(self) -> str:
        return f"[{time.monotonic() - self.t0:7.1f}s]"

    def on_report(self, node: NodeRecord, verdict: ReportResult) -> None:
        return None

    def on_events(self, node: NodeRecord, events: list[tpb.Event]) -> None:
        for ev in events:
            self.events += 1
            kind = event_kind_name(ev.kind)
            what = f"Xid {ev.xid}" if ev.xid and kind == "xid" else kind + (f" (Xid {ev.xid})" if ev.xid else "")
            print(
                f"{self.stamp()} controller <- {node.node_id} {ev.component}: {what}"
                f" [{severity_name(ev.severity)}] -> {ev.action}: {ev.message}",
                flush=True,
            )

    def on_presence(self, node: NodeRecord, old_state: str, new_state: str) -> None:
        print(f"{self.stamp()} controller: {node.node_id} {old_state} -> {new_state}", flush=True)


DEMO_INTERVAL_S = 2.0  # the agents' report interval


def demo_probes(interval_s: float = DEMO_INTERVAL_S) -> ProbeConfig:
    """The demo's probe mesh: the controller's thresholds and persistence, its windows sped up to
    the demo (as a scenario's, ``starpulse.app.scenario.runner.probe_settings``): each agent's
    window two report intervals, localisation over ten, 50 probes/s per NIC so that window holds
    as many probes as the default 20/s does over its 30 s."""
    return ProbeConfig(
        enabled=True,
        packets_per_s_per_nic=50.0,
        window_s=max(1, round(2 * interval_s)),
        replan_min_s=0.0,
        localise_window_s=max(10 * interval_s, 5.0),
    )


DEMO_RAILS = 8  # SimNode has 8 RoCE rails (+ a bond, not on the fabric)
DEMO_SPINES = 4
DEMO_BLOCK = 16


def demo_fabric(nodes: int) -> Fabric:
    """The demo's declared fabric: ``nodes`` nodes in blocks of up to 16, 8 rails, 4 spines, and
    as many hot spares as the packaged policy's spare share keeps for them (1 up to 83 nodes)."""
    if nodes < 1:
        raise ValueError("the demo needs at least 1 node")
    return generate_fabric(
        nodes=nodes,
        gpus_per_node=8,
        rails=DEMO_RAILS,
        nodes_per_block=min(DEMO_BLOCK, nodes),
        spines=DEMO_SPINES,
        spares=demo_spares(nodes),
    )


def demo_spares(nodes: int) -> int:
    """Hot spares the demo declares besides ``nodes``: the packaged policy's target for them."""
    return RepairPolicy().spare_target_for(nodes)


DEMO_REPAIR: dict[str, Any] = {
    # A GPU fault is reset first; anything else is validated first (the demo ends its faults
    # after a while, so the evidence goes), then rebooted; the ladder ends in retirement.
    "ladders": {"gpu_fault": ["reset_gpu", "reboot", "retire"], "default": ["none", "reboot", "retire"]},
    "timeouts": {"reset_gpu": "30s", "reboot": "60s"},
    "validation": {
        "default": {
            "scan_clean": True,
            "clear_within": "40s",
            "evidence_quiet": "8s",
            "diagnostics": [{"name": "burn_in", "timeout": "20s", "pass": "regex:0 errors"}],
        }
    },
    "return_to": "spare",  # up to the packaged spare_share of the fleet (1 spare up to 83 nodes)
    "lemon": {"window": "1h", "retire_after_returns": 2},
}
"""The demo's repair section: the packaged policy's, with time limits a demo can wait out."""

BURN_IN = [sys.executable, "-c", "import time; time.sleep(1.0); print('burn-in: 0 errors')"]
"""The demo nodes' burn-in diagnostic: a real subprocess the agent runs under its limit."""

BAD_BURN_IN = [sys.executable, "-c", "import sys, time; time.sleep(1.0); print('burn-in: 3 errors'); sys.exit(1)"]
"""A bad board's burn-in (a seeded run's retirement): it finds errors after every repair."""


def demo_guards(fleet_size: int) -> GuardConfig:
    """The demo's guards. The packaged defaults are for a fleet (5 % of it out at once, 2
    evictions per 10 minutes), where 17 nodes round down to one node out, and the demo's pace
    overlaps two repairs now and then (a second fault while the first node is still being
    validated): so two nodes may be out at once whatever the demo's size. The demo injects a
    fault every 25-35 s, far faster than a fleet sees them, so its eviction budget is what that
    pace needs (one per fault in the window): with a budget below it, the later faults of a long
    run were refused rather than healed. The fleet share, the breaker, the cool-down (counted
    from a node's return) and flap protection still hold."""
    window_s = GuardConfig().window_s
    return GuardConfig(
        max_fleet_share=min(1.0, 2.5 / max(fleet_size, 1)),
        max_evictions_per_window=math.ceil(window_s / FAULT_EVERY_S[0]),
    )


async def agents_online(controller: Controller, expected: int, stop: asyncio.Event, printer: DemoPrinter) -> None:
    """Wait (at most 30 s) until every simulated node's agent has registered, a spinner on a
    terminal's stderr meanwhile; then say how long the start took."""
    started = time.monotonic()
    with status(f"starting {counted(expected, 'agent')}"):
        while online_count(controller) < expected and not stop.is_set() and time.monotonic() - started < 30.0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.1)
    took = time.monotonic() - started
    online = online_count(controller)
    print(f"{printer.stamp()} {online} of {counted(expected, 'node')} online after {took:.1f}s", flush=True)


def online_count(controller: Controller) -> int:
    """How many nodes the controller hears from now."""
    return sum(1 for n in controller.registry.nodes.values() if n.state == "online")


def counted(n: int, word: str) -> str:
    """``1 event``, ``2 events``: an SRE's words, not ``1 events`` or ``event(s)``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def demo_policy(workdir: Path) -> Path:
    """The packaged policy with the demo's repair section, written where the controller reads it."""
    doc = yaml.safe_load(default_policy_path().read_text())
    doc["repair"] = DEMO_REPAIR
    path = workdir / "policy.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def dashboard_url(http: str, port: int) -> str:
    """Where a browser on this machine finds the dashboard (a wildcard bind is reached on loopback)."""
    host = http.rsplit(":", 1)[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


def settled(controller: Controller) -> bool:
    """No node in the repair loop, every job running and the spare pool at its target: what a
    finished demo shows."""
    healer = controller.healer
    if healer is None or healer.repairs is None:
        return True
    if healer.repairs.nodes_to_drive():
        return False
    if any(job.state != "running" for job in controller.jobs.jobs()):
        return False
    pool = healer.spares.counts()["available"] if healer.spares is not None else 0
    if pool >= healer.repairs.spare_target():
        return True
    # Short, and nothing left to refill it: every node still in the fleet is at work (a
    # retired node is gone; the demo has no new hardware to bring).
    working = {r.node for job in controller.jobs.jobs() for r in job.ranks.values()}
    nodes = controller.fabric.nodes() if controller.fabric is not None else []
    return not [n for n in nodes if healer.store.state(n) == "in_service" and n not in working]


def _logs_to_file(run: Callable[P, Coroutine[Any, Any, None]]) -> Callable[P, Coroutine[Any, Any, None]]:
    """The demo with its structured logs in its ``log_path`` (None: ``workdir/demo.log``), never on the screen.

    Every way in (``starpulse demo``, ``bench.demo_repair``, the e2e tests) comes through here,
    so whatever logging the caller set up, the story on stdout is the only thing printed there.
    """

    @functools.wraps(run)
    async def with_logs(*args: P.args, **kwargs: P.kwargs) -> None:
        bound = inspect.signature(run).bind(*args, **kwargs)
        bound.apply_defaults()
        path = bound.arguments["log_path"] or Path(bound.arguments["workdir"]) / "demo.log"
        bound.arguments["log_path"] = path
        saved, root = structlog.get_config(), logging.getLogger()
        handlers, level = list(root.handlers), root.level
        with path.open("a", encoding="utf-8") as log:
            configure_logging("info", fmt="json", stream=log)
            try:
                await run(*bound.args, **bound.kwargs)
            finally:  # the caller's logging again (the CLI's error handling): never the closed file
                structlog.configure(**saved)
                root.handlers[:] = handlers
                root.setLevel(level)

    return with_logs


@_logs_to_file
async def _demo(
    nodes: int,
    duration_s: float,
    http: str,
    listen: str,
    workdir: Path,
    max_faults: int = 0,
    log_path: Path | None = None,
    script: list[ScriptedFault] | None = None,
    bad_boards: frozenset[str] = frozenset(),
) -> None:
    """``max_faults`` (0: no limit) ends the demo once that many faults were injected and the
    cluster settled (every node repaired or retired, every job running, the pool at its target
    or no node left to refill it). ``script``: these faults in this order instead of drawn ones
    (a seeded run); ``bad_boards``: nodes whose burn-in always fails (they climb to retirement)."""
    t0 = time.monotonic()
    started_ms = SYSTEM_CLOCK.time_ms()  # the fleet report's window: this run
    fabric = demo_fabric(nodes)
    workers = [n for n in fabric.nodes() if not fabric.is_spare(n)]
    scheduler = SimScheduler(list(fabric.nodes()))
    scheduler.add_job("demo-train", workers)
    controller = Controller(
        ControllerConfig(
            listen=listen,
            http=http,
            db_path=workdir / "controller.db",
            heartbeat_timeout_s=6.0,
            fabric=fabric,
            jobs={"demo-train": workers},
            detection=DetectionConfig(probes=demo_probes()),
            heal=HealSettings(
                scheduler=scheduler,
                policy_path=demo_policy(workdir),
                guards=demo_guards(len(fabric.nodes())),
                heal=HealConfig(checkpoint_timeout_s=3.0, repair_poke_s=2.0),
            ),
        ),
        clock=SYSTEM_CLOCK,
    )
    printer = DemoPrinter(t0)
    controller.registry.listeners.append(printer)
    await controller.start()
    target = f"127.0.0.1:{controller.grpc_port}"
    dashboard = dashboard_url(http, controller.http_port)
    print(f"dashboard: {dashboard}", flush=True)
    if log_path is not None:
        print(f"  logs:     {log_path} (the controller's and the agents' JSON lines)")
    summary = fabric.summary()
    print(
        f"starpulse demo: controller on {target}; fabric {summary['node']} nodes, {summary['blocks']} blocks,"
        f" {summary['rails']} rails, {summary['leaf']} leaves, {summary['spine']} spines"
    )
    print(f"  metrics:  {dashboard}metrics")
    print(f"  nodes:    starpulse nodes --controller {target}")
    print(f"  events:   starpulse events --controller {target}")
    print(
        f"starting {counted(nodes, 'simulated node')} + {counted(demo_spares(nodes), 'hot spare')} "
        f"(8 GPUs, 8 RoCE rails + 1 bond each) in {workdir};"
        " self-healing on the in-memory scheduler",
        flush=True,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    sims: list[SimNode] = []
    repairs: dict[str, SimRepairs] = {}
    tasks = []
    # The rail data plane the agents' probes cross (drawn, no sockets: agent.sim.probe_fabric):
    # where the demo's probe faults act, seen by the probe mesh alone.
    plane = SimProbeFabric(fabric.leaf_of, fabric.spines_of)
    for i, node_id in enumerate(fabric.nodes()):
        sim = SimNode(node_id, workdir / node_id, seed=i)
        agent = build_agent(
            AgentConfig(
                node_id=node_id,
                controllers=[target],
                interval_s=DEMO_INTERVAL_S,
                buffer_path=str(workdir / node_id / "buffer.db"),
                allowed_commands={"diagnostic.burn_in": BAD_BURN_IN if node_id in bad_boards else BURN_IN},
                job_socket=str(workdir / node_id / "jobs.sock"),
            ),
            "sim",
            prober=DrawnProber(plane, seed=i),
            sim=sim,
        )
        sims.append(sim)
        repairs[node_id] = SimRepairs(agent, sim, reboot_s=3.0)
        tasks.append(asyncio.create_task(agent.run(stop)))
    await agents_online(controller, len(sims), stop, printer)
    training = DemoTraining(scheduler, "demo-train", lambda n: str(workdir / n / "jobs.sock"), workdir)
    tasks.append(asyncio.create_task(training.run(stop)))
    ranks = counted(len(workers), "rank")
    print(f"training: {ranks} of {RANK_MODULE} (in the package), one per node, each through its agent's job socket")

    pacer = FaultPacer(fabric, sims, repairs, controller, scheduler, printer.stamp, script=script, plane=plane)
    shown = (0, 0, 0)  # decisions, evictions, repair outcomes printed so far
    pool_empty = False
    resumes_shown: set[tuple[str, int]] = set()
    ladder = LadderShown()
    try:
        while not stop.is_set():
            now = time.monotonic()
            if duration_s and now - t0 >= duration_s:
                break
            healer = controller.healer
            done_injecting = (max_faults and pacer.injected >= max_faults) or pacer.script_done
            if done_injecting and not pacer.active and settled(controller):
                break
            if not done_injecting:
                pacer.maybe_inject(now)
            if healer is not None:
                shown = show_healing(printer, healer, shown)
                show_ladder(printer, healer, ladder)
                pool_empty = show_pool(printer, healer, pool_empty)
                resumes_shown = show_resumes(printer, controller, resumes_shown)
            pacer.clear_due(now)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        if controller.healer is not None:
            show_ladder(printer, controller.healer, ladder)  # the last steps before the end
        online = online_count(controller)
        stored = controller.store.count_events()
        summary_lines = demo_summary(
            controller,
            pacer.injected,
            time.monotonic() - t0,
            leaf_faults=pacer.leaf_faults,
            probe_faults=pacer.probe_faults,
        )
        report = fleet_report(controller.store.connection, started_ms, controller.clock.time_ms() + 1).to_dict()
        await controller.stop()
        print(
            f"demo over: {online}/{len(fabric.nodes())} nodes online, {counted(stored, 'event')} stored, "
            f"{printer.events} shown"
        )
        for line in summary_lines:
            print(f"  {line}")
        print("the same run as `starpulse report --since` its length gives it (docs/reliability.md):")
        for line in report_lines(report):
            print(f"  {line}")


@dataclass
class LadderShown:
    """What ``show_ladder`` printed already: per node, its transitions and its repair's steps."""

    transitions: dict[str, int] = field(default_factory=dict)
    steps: dict[str, tuple[str | None, int, int]] = field(default_factory=dict)  # (incident, started, shown)


LADDER_STATES = frozenset({"evicted", "repairing", "validating"})  # moves out of these are the ladder's


def show_ladder(printer: DemoPrinter, healer: Healer, shown: LadderShown) -> None:
    """Each repair rung as it happens: the node onto a rung (reset, reboot), each step's result
    (the reset or reboot, every validation check), and its way out (spare, in service, retired)."""
    repairs = healer.repairs
    if repairs is None:
        return
    for record in healer.store.all_records():
        node = record.node
        lines: list[tuple[int, str]] = []  # (at_ms, line): steps, then moves, in time order
        rep = repairs.repair(node)
        if rep is not None:
            incident, started, done = shown.steps.get(node, (None, 0, 0))
            if (incident, started) != (rep.incident_id, rep.started_ms):
                done = 0  # a new repair of the node: its steps start again
            for step in rep.evidence[done:]:
                result = "ok" if step["ok"] else "failed"
                detail = str(step["detail"]).splitlines()[0][:160] if step["detail"] else ""
                lines.append((int(step["at_ms"]), f"{node} {step['step']} {result}: {detail}"))
            shown.steps[node] = (rep.incident_id, rep.started_ms, len(rep.evidence))
        history = healer.store.history(node)
        for t in history[shown.transitions.get(node, 0) :]:
            if str(t.from_state) in LADDER_STATES:
                lines.append((t.at_ms, f"{node} {t.from_state} -> {t.to_state} ({t.reason})"))
        shown.transitions[node] = len(history)
        for _, line in sorted(lines, key=lambda item: item[0]):
            print(f"{printer.stamp()} ladder: {line}", flush=True)


def show_resumes(printer: DemoPrinter, controller: Controller, shown: set[tuple[str, int]]) -> set[tuple[str, int]]:
    """Say when a job trains again after a fault (its first step after the resume)."""
    for job in controller.jobs.jobs():
        for i, h in enumerate(job.history):
            if h.first_step_ms is None or (job.job, i) in shown:
                continue
            shown.add((job.job, i))
            print(
                f"{printer.stamp()} job {job.job} resumed ({h.reason}): step {h.first_step} after "
                f"{(h.first_step_ms - h.interrupted_ms) / 1000:.1f}s down, "
                f"{counted(h.steps_lost, 'step')} lost",
                flush=True,
            )
    return shown


def show_pool(printer: DemoPrinter, healer: Healer, was_empty: bool) -> bool:
    """Say when the spare pool runs dry (the StarpulseSparePoolEmpty alert's condition) and
    when it refills; True while it is empty."""
    if healer.spares is None or healer.repairs is None or healer.repairs.spare_target() <= 0:
        return False
    available = healer.spares.counts()["available"]
    target = healer.repairs.spare_target()
    if available == 0 and not was_empty:
        print(
            f"{printer.stamp()} alert: spare pool empty (0 of target {target}): StarpulseSparePoolEmpty; "
            "a job that loses a node now waits for capacity, or runs on fewer nodes where it allows",
            flush=True,
        )
    elif available > 0 and was_empty:
        print(f"{printer.stamp()} spare pool refilled: {available} of target {target}", flush=True)
    return available == 0


def show_healing(printer: DemoPrinter, healer: Healer, shown: tuple[int, int, int]) -> tuple[int, int, int]:
    """Print the healer's decisions, evictions and repair outcomes since ``shown``; the new counts."""
    for decision in healer.decisions[shown[0] :]:
        print(f"{printer.stamp()} healer: {decision_line(decision)}", flush=True)
    for eviction in healer.evictions[shown[1] :]:
        print(f"{printer.stamp()} healer: {eviction.describe()}", flush=True)
    outcomes = healer.repairs.outcomes if healer.repairs is not None else []
    for outcome in outcomes[shown[2] :]:
        took = f" after {outcome['took_ms'] / 1000:.0f}s" if "took_ms" in outcome else ""
        why = f": {outcome['why']}" if "why" in outcome else ""
        if outcome["outcome"] == "retired":
            why = f" (RMA notice: out for hardware inspection){why}"
        print(f"{printer.stamp()} repair: {outcome['node']} -> {outcome['outcome']}{took}{why}", flush=True)
    return len(healer.decisions), len(healer.evictions), len(outcomes)


ETTR_DEFINITION = (
    "ETTR = productive training time / wall time, from the job's start to the end of the demo: wall time less the "
    "time down (fault to the first step after the resume) and the time spent redoing the steps lost"
)


def job_lines(job: JobRecord, now_ms: int) -> list[str]:
    """The job's story in the summary: per fault the time to resume and steps lost, then ETTR."""
    # A job waiting for capacity has no ranks running: its furthest step is in its history.
    reached = max([job.step, job.last_complete_step, *(h.interrupted_step for h in job.history)])
    if reached == 0:
        return [f"job {job.job}: {counted(job.restarts, 'requeue')}; no training process reported a step"]
    lines = [
        f"job {job.job}: {job.state} at step {reached}, {counted(job.restarts, 'restart')}, "
        f"{counted(job.steps_lost, 'step')} lost, {job.downtime_s:.0f}s down"
    ]
    for i, h in enumerate(job.history, 1):
        resumed = (
            f"resumed after {(h.first_step_ms - h.interrupted_ms) / 1000:.1f}s"
            if h.first_step_ms
            else "not resumed yet"
        )
        frm = f" from step {h.resumed_from_step}" if h.resumed_from_step is not None else ""
        lines.append(f"  fault {i} ({h.reason}): {resumed}{frm}, {counted(h.steps_lost, 'step')} lost")
    step_s = [r.step_time_s for r in job.ranks.values() if r.step_time_s > 0]
    step_time = sum(step_s) / len(step_s) if step_s else 0.0
    wall_s = max(now_ms - job.first_seen_ms, 0) / 1000
    productive = max(wall_s - job.downtime_s - job.steps_lost * step_time, 0.0)
    if wall_s > 0:
        lines.append(f"ETTR {productive / wall_s:.1%} ({productive:.0f}s productive of {wall_s:.0f}s)")
    return lines


def demo_summary(
    controller: Controller, injected: int, ran_s: float, leaf_faults: int = 0, probe_faults: int = 0
) -> list[str]:
    """What the run came to: faults, evictions, repairs, the pool, the job (printed at the end)."""
    healer = controller.healer
    if healer is None:
        return [f"faults injected: {injected}"]
    outcomes = healer.repairs.outcomes if healer.repairs is not None else []
    returned = [o for o in outcomes if o["outcome"] in ("spare", "in_service")]
    retired = [o for o in outcomes if o["outcome"] == "retired"]
    took = sorted(o["took_ms"] / 1000 for o in returned)
    states: dict[str, int] = {}
    for rec in healer.store.all_records():
        states[str(rec.state)] = states.get(str(rec.state), 0) + 1
    pool = healer.spares.counts() if healer.spares is not None else {}
    target = healer.repairs.spare_target() if healer.repairs is not None else 0
    refused = sum(1 for d in healer.decisions if d["outcome"] not in ("ok", "alert_only", "already_out_of_service"))
    lines = [
        f"ran {ran_s:.0f}s; faults injected: {injected} ({counted(leaf_faults, 'leaf switch fault')}, "
        f"{counted(probe_faults, 'fault')} only probes see); "
        f"evictions: {len(healer.evictions)}; refused by the guards: {refused}",
        f"nodes repaired and returned: {len(returned)}"
        + (f" (eviction to back in the pool: median {took[len(took) // 2]:.0f}s)" if took else "")
        + f"; retired: {len(retired)}",
        f"spare pool: {pool.get('available', 0)} available of target {target}, {pool.get('allocated', 0)} standing in",
        "nodes by lifecycle (with a row): " + (", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "-"),
    ]
    now_ms = controller.clock.time_ms()
    for job in controller.jobs.jobs():
        lines.extend(job_lines(job, now_ms))
    lines.append(ETTR_DEFINITION)
    return lines


def run_demo(
    nodes: int = 16, duration_s: float = 0.0, http: str = "127.0.0.1:8080", listen: str = "127.0.0.1:0"
) -> int:
    """Run the demo; its stdout is one readable stream, the structured logs go to a file it names.

    The file outlives the demo (the simulated nodes' folder does not): the logs are what an
    operator reads after the story on screen, to see the same events as the controller logged them.
    """
    if nodes < 1:
        raise SystemExit("--nodes must be at least 1")
    fd, log_name = tempfile.mkstemp(prefix="starpulse-demo-", suffix=".log")
    try:
        os.close(fd)  # _demo appends to it
        with tempfile.TemporaryDirectory(prefix="starpulse-demo-") as tmp:
            asyncio.run(_demo(nodes, duration_s, http, listen, Path(tmp), log_path=Path(log_name)))
    except BaseException:  # it never ran (a taken port) or broke: the error goes to the terminal, no stray file
        Path(log_name).unlink(missing_ok=True)
        raise
    return 0
