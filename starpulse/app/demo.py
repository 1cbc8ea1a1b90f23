"""`starpulse demo`: a controller and N simulated agents on loopback, with faults on a timer.

Everything here is the real code path (gRPC streams, SQLite, collectors reading fake
NVML and sysfs); only the hardware is simulated. The controller gets a generated fabric
matching the simulated nodes (8 rails, blocks of up to 16 nodes, 4 spines), so its web
dashboard draws the fabric and the faults; the first line printed is the dashboard's
address. It prints what happens as it happens.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import tempfile
import time
from pathlib import Path

from agent.factory import build_agent
from agent.runtime import AgentConfig
from agent.sim.faults import FAULTS
from agent.sim.node import SimNode
from controller.fabric import Fabric, generate_fabric
from controller.heal.healer import HealConfig
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
            xid = f" xid {ev.xid}" if ev.xid else ""
            print(
                f"{self.stamp()} controller <- {node.node_id} {ev.component}: {event_kind_name(ev.kind)}{xid}"
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


def dashboard_url(http: str, port: int) -> str:
    """Where a browser on this machine finds the dashboard (a wildcard bind is reached on loopback)."""
    host = http.rsplit(":", 1)[0].strip("[]")
    if host in ("", "0.0.0.0", "::"):
        host = "127.0.0.1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}/"


async def _demo(nodes: int, duration_s: float, http: str, listen: str, workdir: Path) -> None:
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
            heal=HealSettings(scheduler=scheduler, heal=HealConfig(checkpoint_timeout_s=3.0)),
        )
    )
    printer = DemoPrinter(t0)
    controller.registry.listeners.append(printer)
    await controller.start()
    target = f"127.0.0.1:{controller.grpc_port}"
    dashboard = dashboard_url(http, controller.http_port)
    print(f"dashboard: {dashboard}", flush=True)
    summary = fabric.summary()
    print(
        f"starpulse demo: controller on {target}; fabric {summary['node']} nodes, {summary['blocks']} blocks,"
        f" {summary['rails']} rails, {summary['leaf']} leaves, {summary['spine']} spines"
    )
    print(f"  metrics:  {dashboard}metrics")
    print(f"  nodes:    starpulse nodes --controller {target}")
    print(f"  events:   starpulse events --controller {target}")
    print(
        f"starting {nodes} simulated nodes + 1 hot spare (8 GPUs, 8 RoCE rails + 1 bond each) in {workdir};"
        " self-healing on the in-memory scheduler",
        flush=True,
    )

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)

    sims: list[SimNode] = []
    tasks = []
    for i, node_id in enumerate(fabric.nodes()):
        sim = SimNode(node_id, workdir / node_id, seed=i)
        agent = build_agent(
            AgentConfig(
                node_id=node_id,
                controllers=[target],
                interval_s=2.0,
                buffer_path=str(workdir / node_id / "buffer.db"),
            ),
            "sim",
            sim=sim,
        )
        sims.append(sim)
        tasks.append(asyncio.create_task(agent.run(stop)))

    rng = random.Random(7)
    menu = fault_menu()
    active: list[tuple[float, SimNode, str, str, dict[str, object]]] = []
    next_fault = time.monotonic() + 6.0
    shown_decisions = shown_evictions = 0
    try:
        while not stop.is_set():
            now = time.monotonic()
            if duration_s and now - t0 >= duration_s:
                break
            if now >= next_fault:
                kind, part, params = rng.choice(menu)
                sim = rng.choice(sims)
                target_component = f"{part}-{rng.randrange(8)}"
                detail = " ".join(f"{k}={v}" for k, v in params.items())
                print(
                    f"{printer.stamp()} inject {kind} {detail} on {sim.node_id}/{target_component}",
                    flush=True,
                )
                sim.inject(kind, target_component, **params)
                active.append((now + 20.0, sim, kind, target_component, params))
                next_fault = now + rng.uniform(5.0, 9.0)
            healer = controller.healer
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
                    print(
                        f"{printer.stamp()} healer: evicted {eviction.node}, jobs {eviction.jobs} requeued "
                        f"onto spare {eviction.replacement}" + (" (dry run)" if eviction.dry_run else ""),
                        flush=True,
                    )
                shown_evictions = len(healer.evictions)
            for item in [a for a in active if a[0] <= now]:
                active.remove(item)
                _, sim, kind, target_component, params = item
                print(f"{printer.stamp()} clear {kind} on {sim.node_id}/{target_component}", flush=True)
                sim.clear(kind, target_component, **params)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=0.5)
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        online = sum(1 for n in controller.registry.nodes.values() if n.state == "online")
        stored = controller.store.count_events()
        await controller.stop()
        print(f"demo over: {online}/{len(fabric.nodes())} nodes online, {stored} events stored, {printer.events} shown")


def run_demo(
    nodes: int = 16, duration_s: float = 0.0, http: str = "127.0.0.1:8080", listen: str = "127.0.0.1:0"
) -> int:
    if nodes < 1:
        raise SystemExit("--nodes must be at least 1")
    configure_logging("warning", fmt="console")
    with tempfile.TemporaryDirectory(prefix="starpulse-demo-") as tmp:
        asyncio.run(_demo(nodes, duration_s, http, listen, Path(tmp)))
    return 0
