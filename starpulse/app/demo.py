"""`starpulse demo`: a controller and N simulated agents on loopback, with faults on a timer.

Everything here is the real code path (gRPC streams, SQLite, collectors reading fake
NVML and sysfs); only the hardware is simulated. The controller gets a generated fabric
matching the simulated nodes (8 rails, blocks of up to 16 nodes, 4 spines), so its web
dashboard draws the fabric and the faults; the first line printed is the dashboard's
address. It prints what happens as it happens.

The repair loop runs too (issue 19): each evicted node is repaired (the simulated GPU reset
or reboot, ``agent.sim.repairs``), validated (its conditions clear, nothing new for a few
seconds, a burn-in diagnostic run by its agent as a real subprocess) and returned to the
spare pool, or retired. Faults come at a pace the guards let the cluster absorb (one node
out at a time in a 17-node fleet) and ``demo over`` ends with a summary: faults, evictions,
nodes repaired and retired, the pool against its target, the job's restarts and downtime.

Not done yet: real training processes (``examples/train.py`` through each node's job
socket); the demo's job lives in the in-memory scheduler only.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from agent.factory import build_agent
from agent.runtime import AgentConfig
from agent.sim.faults import FAULTS
from agent.sim.node import SimNode
from agent.sim.repairs import SimRepairs
from controller.fabric import Fabric, generate_fabric
from controller.heal.healer import HealConfig
from controller.heal.policy import default_policy_path
from controller.heal.scheduler.sim import SimScheduler
from controller.ingest.registry import NodeRecord
from controller.ingest.verdict import ReportResult
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.core.findings import event_kind_name, severity_name
from starpulse.core.logs import configure_logging
from starpulse.v1 import telemetry_pb2 as tpb


def fault_menu() -> list[tuple[str, str, dict[str, object]]]:
    """What the demo draws from: (kind, part, parameters) for each demo entry of the fault table, in its order."""
    return [(kind.name, kind.node.part, dict(params)) for kind in FAULTS if kind.node for params in kind.demo]


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


DEMO_RAILS = 8  # SimNode has 8 RoCE rails (+ a bond, not on the fabric)
DEMO_SPINES = 4
DEMO_BLOCK = 16


def demo_fabric(nodes: int) -> Fabric:
    """The demo's declared fabric: ``nodes`` nodes in blocks of up to 16, 8 rails, 4 spines."""
    if nodes < 1:
        raise ValueError("the demo needs at least 1 node")
    return generate_fabric(
        nodes=nodes,
        gpus_per_node=8,
        rails=DEMO_RAILS,
        nodes_per_block=min(DEMO_BLOCK, nodes),
        spines=DEMO_SPINES,
        spares=1,
    )


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
    "return_to": "spare",
    "spare_target": 1,
    "lemon": {"window": "1h", "retire_after_returns": 2},
}
"""The demo's repair section: the packaged policy's, with time limits a demo can wait out."""

BURN_IN = [sys.executable, "-c", "import time; time.sleep(1.0); print('burn-in: 0 errors')"]
"""The demo nodes' burn-in diagnostic: a real subprocess the agent runs under its limit."""

FAULT_EVERY_S = (20.0, 30.0)
"""Seconds between faults: a repair takes ~15 s here, so one node is out at a time, as the
default guards (5 % of the fleet) allow in a 17-node fleet."""


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
    """No node in the repair loop, and the spare pool at its target: what a finished demo shows."""
    healer = controller.healer
    if healer is None or healer.repairs is None:
        return True
    if healer.repairs.nodes_to_drive():
        return False
    pool = healer.spares.counts()["available"] if healer.spares is not None else 0
    return pool >= healer.repairs.policy.spare_target


async def _demo(
    nodes: int,
    duration_s: float,
    http: str,
    listen: str,
    workdir: Path,
    max_faults: int = 0,
    log_path: Path | None = None,
) -> None:
    """``max_faults`` (0: no limit) ends the demo once that many faults were injected and the
    cluster settled (every node repaired or retired, the pool at its target)."""
    t0 = time.monotonic()
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
            heal=HealSettings(
                scheduler=scheduler,
                policy_path=demo_policy(workdir),
                heal=HealConfig(checkpoint_timeout_s=3.0, repair_poke_s=2.0),
            ),
        )
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
        f"starting {counted(nodes, 'simulated node')} + 1 hot spare (8 GPUs, 8 RoCE rails + 1 bond each) in {workdir};"
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
    for i, node_id in enumerate(fabric.nodes()):
        sim = SimNode(node_id, workdir / node_id, seed=i)
        agent = build_agent(
            AgentConfig(
                node_id=node_id,
                controllers=[target],
                interval_s=2.0,
                buffer_path=str(workdir / node_id / "buffer.db"),
                allowed_commands={"diagnostic.burn_in": BURN_IN},
            ),
            "sim",
            sim=sim,
        )
        sims.append(sim)
        repairs[node_id] = SimRepairs(agent, sim, reboot_s=3.0)
        tasks.append(asyncio.create_task(agent.run(stop)))

    rng = random.Random(7)
    menu = fault_menu()
    active: list[tuple[float, SimNode, str, str, dict[str, object]]] = []
    next_fault = time.monotonic() + 6.0
    shown_decisions = shown_evictions = shown_repairs = 0
    injected = 0
    try:
        while not stop.is_set():
            now = time.monotonic()
            if duration_s and now - t0 >= duration_s:
                break
            healer = controller.healer
            if max_faults and injected >= max_faults and not active and settled(controller):
                break
            if now >= next_fault and not (max_faults and injected >= max_faults):
                kind, part, params = rng.choice(menu)
                in_service = [x for x in sims if healer is None or healer.store.state(x.node_id) == "in_service"]
                sim = rng.choice(in_service or sims)
                target_component = f"{part}-{rng.randrange(8)}"
                detail = " ".join(f"{k}={v}" for k, v in params.items())
                print(
                    f"{printer.stamp()} inject {kind} {detail} on {sim.node_id}/{target_component}",
                    flush=True,
                )
                repairs[sim.node_id].inject(kind, target_component, **params)
                injected += 1
                active.append((now + 20.0, sim, kind, target_component, params))
                next_fault = now + rng.uniform(*FAULT_EVERY_S)
            if healer is not None:
                for decision in healer.decisions[shown_decisions:]:
                    print(
                        f"{printer.stamp()} healer: {decision['incident']} {decision['kind']} -> "
                        f"{decision['action']} on {decision['node'] or '-'}: {decision['outcome']} "
                        f"({decision['reason']})",
                        flush=True,
                    )
                shown_decisions = len(healer.decisions)
                for eviction in healer.evictions[shown_evictions:]:
                    print(f"{printer.stamp()} healer: {eviction.describe()}", flush=True)
                shown_evictions = len(healer.evictions)
                outcomes = healer.repairs.outcomes if healer.repairs is not None else []
                for outcome in outcomes[shown_repairs:]:
                    took = f" after {outcome['took_ms'] / 1000:.0f}s" if "took_ms" in outcome else ""
                    why = f": {outcome['why']}" if "why" in outcome else ""
                    print(f"{printer.stamp()} repair: {outcome['node']} -> {outcome['outcome']}{took}{why}", flush=True)
                shown_repairs = len(outcomes)
            for item in [a for a in active if a[0] <= now]:
                active.remove(item)
                _, sim, kind, target_component, params = item
                if repairs[sim.node_id].clear(kind, target_component, **params):
                    print(f"{printer.stamp()} clear {kind} on {sim.node_id}/{target_component}", flush=True)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        online = sum(1 for n in controller.registry.nodes.values() if n.state == "online")
        stored = controller.store.count_events()
        summary_lines = demo_summary(controller, injected, time.monotonic() - t0)
        await controller.stop()
        print(
            f"demo over: {online}/{len(fabric.nodes())} nodes online, {counted(stored, 'event')} stored, "
            f"{printer.events} shown"
        )
        for line in summary_lines:
            print(f"  {line}")


def demo_summary(controller: Controller, injected: int, ran_s: float) -> list[str]:
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
    target = healer.repairs.policy.spare_target if healer.repairs is not None else 0
    lines = [
        f"faults injected: {injected}; evictions: {len(healer.evictions)}",
        f"nodes repaired and returned: {len(returned)}"
        + (f" (eviction to back in the pool: median {took[len(took) // 2]:.0f}s)" if took else "")
        + f"; retired: {len(retired)}",
        f"spare pool: {pool.get('available', 0)} available of target {target}, {pool.get('allocated', 0)} standing in",
        "nodes by lifecycle (with a row): " + (", ".join(f"{k} {v}" for k, v in sorted(states.items())) or "-"),
    ]
    for job in controller.jobs.jobs():
        if job.step == 0:  # nothing trains yet: no step was ever reported, so no ETTR to give
            lines.append(
                f"job {job.job}: {counted(job.restarts, 'requeue')}; no training process reports steps in this demo"
            )
            continue
        down = job.downtime_s
        ettr = max(0.0, 1.0 - down / ran_s) if ran_s > 0 else 0.0
        lines.append(
            f"job {job.job}: {job.state}, {counted(job.restarts, 'restart')}, {counted(job.steps_lost, 'step')} lost, "
            f"{down:.0f}s down (ETTR {ettr:.0%} of {ran_s:.0f}s)"
        )
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
        with os.fdopen(fd, "w", encoding="utf-8") as log, tempfile.TemporaryDirectory(prefix="starpulse-demo-") as tmp:
            configure_logging("info", fmt="json", stream=log)
            asyncio.run(_demo(nodes, duration_s, http, listen, Path(tmp), log_path=Path(log_name)))
    except BaseException:  # it never ran (a taken port) or broke: the error goes to the terminal, no stray file
        Path(log_name).unlink(missing_ok=True)
        raise
    finally:  # whatever logs next (the CLI's own error handling) must not write to the closed file
        configure_logging("warning", fmt="console", stream=sys.stderr)
    return 0
