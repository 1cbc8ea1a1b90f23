"""Prometheus expositions to test against, and reading their samples."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import fakeredis
import pytest
import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from agent.collectors.sonic import SonicSwitchCollector
from agent.factory import build_collectors
from agent.metrics import AgentMetricsCollector, AgentStatus
from agent.runtime import CollectorSet
from agent.sim.fake_switch import FakeSwitch
from agent.sim.node import SimNode
from controller.metrics import ControllerMetrics
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

PROMTOOL = shutil.which("promtool")


def exposition(node: str, inventory: ipb.Inventory, report: tpb.Report | None, status: AgentStatus | None) -> str:
    registry = CollectorRegistry()
    registry.register(
        AgentMetricsCollector(node, lambda: inventory, lambda: report, (lambda: status) if status else None)
    )
    return generate_latest(registry).decode()


def samples(text: str) -> list[Sample]:
    return [s for fam in text_string_to_metric_families(text) for s in fam.samples]


def find(text: str, name: str, **labels: str) -> list[Sample]:
    return [s for s in samples(text) if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())]


def one(text: str, name: str, **labels: str) -> float:
    found = find(text, name, **labels)
    assert len(found) == 1, f"{name}{labels}: {len(found)} samples"
    return found[0].value


def agent_expositions(workdir: Path) -> list[str]:
    """A compute node's and a switch's expositions: between them every agent family appears."""
    cycle = sim_cycle(workdir)
    status = AgentStatus(events_buffered=2, events_dropped_total=1, reports_sent_total=5, cycles_total=6)
    _, sw = switch_cycle()
    return [
        exposition("node-000", cycle.inventory, cycle.report, status),
        exposition("leaf-b0-r0", sw.inventory, sw.report, status),
    ]


def promtool_check(text: str) -> None:
    if PROMTOOL is None:
        pytest.skip("promtool not installed (apt-get install --no-install-recommends prometheus)")
    proc = subprocess.run(
        [PROMTOOL, "check", "metrics"], check=False, input=text, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def sim_cycle(
    workdir: Path, node: str = "node-000", faults: tuple[tuple[str, str, dict[str, object]], ...] = ()
) -> Cycle:
    """One real collection cycle (probe, describe, collect) of the sim backend's collectors."""
    sim = SimNode(node, workdir / node / "hw", seed=0)
    plan = build_collectors("sim", None, sim=sim, kmsg_path=None)
    cs = CollectorSet(plan.collectors)
    cs.probe()
    inventory = cs.describe()
    for hook in plan.inventory_hooks:
        hook(inventory)
    for kind, target, params in faults:
        sim.inject(kind, target, **params)
    sim.advance(1.0)
    report = cs.collect(1).report
    cs.close()
    return Cycle(inventory, report)


def switch_cycle(name: str = "leaf-b0-r0") -> tuple[FakeSwitch, Cycle]:
    """A real SonicSwitchCollector cycle on a FakeSwitch: Ethernet0 down, 4 storming, 8 with weak optics."""
    factory = _Factory()
    fake = FakeSwitch(factory, name, ports=4)
    fake.install()
    fake.advance(5.0)
    fake.port_down("Ethernet0")
    fake.pfc_storm("Ethernet4")
    fake.optics_degraded("Ethernet8")
    cs = CollectorSet([SonicSwitchCollector(factory, name)])
    cs.probe()
    inventory = cs.describe()
    report = cs.collect(1).report
    cs.close()
    return fake, Cycle(inventory, report)


def controller_exposition() -> str:
    """A controller registry with every family exercised, as a busy controller would have it."""
    m = ControllerMetrics()
    m.reports.inc(3)
    m.samples.labels("gpu").inc(24)
    m.events.labels("xid").inc()
    m.rejected.labels("rate_limited").inc()
    m.streams.set(2)
    m.nodes.labels("online").set(2)
    m.nodes.labels("unreachable").set(1)
    m.ingest_seconds.observe(0.002)
    m.incidents_open.labels("gpu_fault").set(1)
    m.detection_seconds.observe(2.5)
    m.command_queue.set(1)
    m.evictions.labels("gpu_fault", "incident").inc()
    m.breaker_open.labels("eviction").set(1)
    m.set_outbox_depth_source(lambda: 4)
    m.alert_notifications.labels("webhook", "sent").inc()
    return generate_latest(m.registry).decode()


@dataclass
class Cycle:
    inventory: ipb.Inventory
    report: tpb.Report


class _Factory:
    def __init__(self) -> None:
        self.server = fakeredis.FakeServer()

    def __call__(self, db: int) -> redis.Redis:
        return fakeredis.FakeRedis(server=self.server, db=db, decode_responses=True)
