"""`starpulse scenario run`: build the fabric, run the real controller and one simulated
agent per node and switch over loopback gRPC, inject faults on schedule, print a verdict.

The scenario clock starts once every agent has registered and reported, so `at_s` means
"seconds into a warmed-up cluster", whatever the machine's speed.
"""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent.sim.faults import FAULTS
from controller.detect.correlate import CorrelationConfig
from controller.detect.failslow import FailSlowConfig
from controller.detect.model import Incident
from controller.detect.pipeline import DetectionConfig
from controller.fabric import Fabric
from controller.fabric.probeplan import ProbeConfig
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.scheduler.sim import SimScheduler
from controller.jobs.hang import HangConfig
from controller.jobs.stall import StallConfig
from controller.service import Controller, ControllerConfig, HealSettings
from starpulse.app.scenario.cluster import SimCluster
from starpulse.app.scenario.spec import FaultSpec, Scenario
from starpulse.app.scenario.training import SimTraining
from starpulse.core.clock import SYSTEM_CLOCK

log = structlog.get_logger(__name__)


@dataclass
class IncidentRecord:
    incident: Incident
    opened_at_s: float
    resolved_at_s: float | None = None


@dataclass
class Recorder:
    """Records incident changes with scenario-relative times (a Detection listener)."""

    t0: float = 0.0
    t0_wall: float = 0.0  # the same instant on the wall clock (evictions carry wall times)
    started: bool = False
    records: dict[str, IncidentRecord] = field(default_factory=dict)

    def now_s(self) -> float:
        return time.monotonic() - self.t0

    def on_incident(self, change: str, incident: Incident) -> None:
        if not self.started:
            return  # incidents from cluster start-up are not part of the scenario
        rec = self.records.get(incident.id)
        if rec is None:
            rec = IncidentRecord(incident, self.now_s())
            self.records[incident.id] = rec
        rec.incident = incident
        if change == "resolved":
            rec.resolved_at_s = self.now_s()
        elif rec.resolved_at_s is not None:
            rec.resolved_at_s = None  # reopened within flap damping


def fault_component(fault: FaultSpec) -> str:
    return fault.target or ",".join(fault.targets)


def _matches(fault: FaultSpec, rec: IncidentRecord) -> bool:
    """Whether an incident answers a fault: a kind the fault table says answers it, about its target."""
    inc = rec.incident
    kind = FAULTS[fault.kind]
    if inc.kind not in kind.incidents:
        return False
    if fault.targets:  # several targets (a partition): an incident that touches any of them
        return bool(set(fault.targets) & set(inc.affected_nodes))
    target = _canonical(fault.target)
    node = target.split("/", 1)[0]
    if inc.root_cause == target or target in inc.root_cause:
        return True
    if ":" in target:  # a switch port: the incident names that switch or a cable on it
        return target.split(":", 1)[0] in inc.root_cause
    if inc.kind in ("node_fault", "node_down", "straggler") and inc.root_cause == node:
        return True
    return kind.answered_by_effect and node in inc.affected_nodes


def _canonical(target: str) -> str:
    """A cable as the controller names it (lower tier first), whichever way the scenario wrote it."""
    try:
        a, b = Fabric.link_ends(target)
    except ValueError:
        return target
    nic_or_leaf = sorted((a, b), key=lambda end: 0 if "/nic-" in end else 1 if end.startswith("leaf") else 2)
    return "<->".join(nic_or_leaf)


def probe_settings(scenario: Scenario) -> ProbeConfig:
    """The probe mesh of a scenario run: the controller's defaults (thresholds, persistence), its
    windows sped up to the run (a scenario is seconds long, not hours): each agent's window is two
    report intervals, localisation reads ten, and each NIC probes at 50/s so a window of ten
    intervals holds as many probes as the default 20/s does over its 30 s."""
    interval = scenario.interval_s
    return ProbeConfig(
        enabled=scenario.probes,
        packets_per_s_per_nic=50.0,
        window_s=max(1, round(2 * interval)),
        replan_min_s=0.0,
        localise_window_s=max(10 * interval, 5.0),
    )


def build_verdict(scenario: Scenario, recorder: Recorder, injected: dict[int, float]) -> dict[str, Any]:
    incidents = sorted(recorder.records.values(), key=lambda r: (r.opened_at_s, r.incident.id))
    faults = []
    for index, fault in enumerate(scenario.faults):
        at = injected.get(index)
        detected = [r for r in incidents if at is not None and r.opened_at_s >= at - 0.01 and _matches(fault, r)]
        faults.append(
            {
                "at_s": fault.at_s,
                "kind": fault.kind,
                "target": fault_component(fault),
                "injected_at_s": None if at is None else round(at, 3),
                "incident": detected[0].incident.id if detected else None,
                "detection_latency_s": round(detected[0].opened_at_s - at, 3) if detected and at is not None else None,
            }
        )
    verdict: dict[str, Any] = {
        "scenario": scenario.name,
        "duration_s": scenario.duration_s,
        "incidents": [
            {
                "id": r.incident.id,
                "kind": r.incident.kind,
                "root_cause": r.incident.root_cause,
                "component_type": r.incident.component_type,
                "affected_nodes": sorted(r.incident.affected_nodes),
                "severity": r.incident.severity,
                "action": r.incident.action,
                "opened_at_s": round(r.opened_at_s, 3),
                "resolved_at_s": None if r.resolved_at_s is None else round(r.resolved_at_s, 3),
            }
            for r in incidents
        ],
        "evictions": [],
        "jobs": [],
        "faults": faults,
    }
    verdict["expectations"] = check_expectations(scenario, verdict)
    return verdict


def check_expectations(scenario: Scenario, verdict: dict[str, Any]) -> dict[str, Any]:
    """Compare the verdict with the scenario's optional `expect:` block."""
    expect = scenario.expect
    failures: list[str] = []
    if expect is not None:
        seen = verdict["incidents"]
        for want in expect.incidents:
            found = [
                i
                for i in seen
                if i["kind"] == want.kind and (want.root_cause is None or i["root_cause"] == want.root_cause)
            ]
            if not found:
                failures.append(f"no {want.kind} incident blaming {want.root_cause or 'anything'}")
            elif want.resolved and all(i["resolved_at_s"] is None for i in found):
                failures.append(f"the {want.kind} incident blaming {want.root_cause or 'anything'} never resolved")
        for kind in expect.forbid_kinds:
            bad = [i["id"] for i in seen if i["kind"] == kind]
            if bad:
                failures.append(f"forbidden {kind} incidents: {', '.join(bad)}")
        if expect.max_incidents is not None and len(seen) > expect.max_incidents:
            failures.append(f"{len(seen)} incidents, at most {expect.max_incidents} expected")
        evicted = sorted(e["node"] for e in verdict.get("evictions", []) if not e.get("dry_run"))
        if expect.evictions is not None and evicted != sorted(expect.evictions):
            failures.append(f"evicted {evicted}, expected {sorted(expect.evictions)}")
        jobs = {j["name"]: j for j in verdict.get("jobs", [])}
        for name in expect.resumed_jobs:
            job = jobs.get(name)
            if job is None or job["restarts"] < 1 or job["resumed_from_step"] is None:
                failures.append(f"job {name} did not restart and resume: {job}")
    return {"checked": expect is not None, "passed": not failures, "failures": failures}


async def run_scenario(scenario: Scenario, workdir: Path | None = None) -> dict[str, Any]:
    """Run one scenario end to end and return its verdict."""
    with contextlib.ExitStack() as stack:
        if workdir is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="starpulse-scenario-")))
        return await _run(scenario, workdir)


async def _run(scenario: Scenario, workdir: Path) -> dict[str, Any]:
    interval = scenario.interval_s
    fabric = scenario.build_fabric()
    jobs = {job.name: scenario.job_nodes(job.name) for job in scenario.jobs}
    scheduler = SimScheduler(list(fabric.nodes()))
    for name, nodes in jobs.items():
        scheduler.add_job(name, nodes)
    controller = Controller(
        ControllerConfig(
            listen="127.0.0.1:0",
            http="127.0.0.1:0",
            db_path=workdir / "controller.db",
            fabric=fabric,
            heartbeat_timeout_s=max(6 * interval, 3.0),
            sweep_interval_s=min(0.25, interval),
            jobs=jobs,
            detection=DetectionConfig(
                correlation=CorrelationConfig(settle_s=max(2 * interval, 1.0), resolve_hold_s=max(6 * interval, 3.0)),
                failslow=FailSlowConfig(
                    window_s=max(10 * interval, 5.0), min_samples=4, persist_evaluations=2, sample_every_s=0
                ),  # a window of ~10 reports: every one is a sample
                failslow_every_s=max(2 * interval, 1.0),
                probes=probe_settings(scenario),
            ),
            # A hang without the job library: the signature over ~8 reports (a minute at 5 s)
            stall=StallConfig(window_s=max(8 * interval, 4.0)),
            hang=HangConfig(every_s=max(interval, 0.5)),
            heal=HealSettings(
                scheduler=scheduler,
                heal=HealConfig(checkpoint_timeout_s=max(4 * interval, 2.0), retry_delay_s=0.2),
                guards=GuardConfig(**scenario.guards),  # type: ignore[arg-type]
            ),
        ),
        clock=SYSTEM_CLOCK,
    )
    recorder = Recorder()
    controller.detection.listeners.append(recorder)
    await controller.start()
    training = SimTraining(
        scheduler,
        controller.jobs,
        controller.registry.nodes.get,
        {job.name: job.checkpoint_every_s or 0.0 for job in scenario.jobs},
    )
    training_stop = asyncio.Event()
    training_task = asyncio.create_task(training.run(training_stop))
    cluster = SimCluster(scenario, workdir, f"127.0.0.1:{controller.grpc_port}", interval)
    injected: dict[int, float] = {}
    try:
        await cluster.start()
        expected = len(fabric.nodes()) + len(fabric.switches())
        deadline = time.monotonic() + 60 + expected * 0.2
        reg = controller.registry
        while sum(1 for n in reg.nodes.values() if n.latest_report is not None) < expected:
            if time.monotonic() > deadline:
                raise TimeoutError(f"only {len(reg.nodes)}/{expected} agents registered")
            await asyncio.sleep(0.1)
        await asyncio.sleep(3 * interval)  # a few reports so counters have a baseline
        # Start-up noise (agents racing to register on a busy machine) must settle first.
        quiet_by = time.monotonic() + 30
        while controller.detection.correlator.incidents(active_only=True) and time.monotonic() < quiet_by:  # noqa: ASYNC110
            await asyncio.sleep(0.2)
        recorder.t0 = time.monotonic()
        recorder.t0_wall = time.time()
        recorder.started = True
        log.info("scenario_started", scenario=scenario.name, agents=expected)
        events: list[tuple[float, int, str]] = []
        for index, fault in enumerate(scenario.faults):
            events.append((fault.at_s, index, "inject"))
            if fault.until_s is not None:
                events.append((fault.until_s, index, "clear"))
        events.sort()
        for at_s, index, what in events:
            delay = at_s - recorder.now_s()
            if delay > 0:
                await asyncio.sleep(delay)
            fault = scenario.faults[index]
            if what == "inject":
                injected[index] = recorder.now_s()
                cluster.inject(fault)
            else:
                cluster.clear(fault)
        remaining = scenario.duration_s - recorder.now_s()
        if remaining > 0:
            await asyncio.sleep(remaining)
        recorder.started = False  # tearing the cluster down is not part of the scenario
    finally:
        recorder.started = False
        training_stop.set()
        await training_task
        healer = controller.healer
        assert healer is not None
        breaker_open = healer.guards.breaker.is_open
        job_records = controller.jobs.jobs()
        await cluster.stop()
        await controller.stop()
    verdict = build_verdict(scenario, recorder, injected)
    verdict["evictions"] = [
        {
            "node": e.node,
            "at_s": round((e.at_ms / 1000) - recorder.t0_wall, 3),
            "replacement": e.replacement,
            "incident": e.incident,
            "dry_run": e.dry_run,
        }
        for e in healer.evictions
    ]
    verdict["jobs"] = [
        {
            "name": j.job,
            "restarts": j.restarts,
            "steps_lost": j.steps_lost,
            "downtime_s": round(j.downtime_s, 3),
            "resumed_from_step": j.resumed_from_step,
        }
        for j in job_records
    ]
    verdict["breaker_open"] = breaker_open
    verdict["expectations"] = check_expectations(scenario, verdict)
    return verdict
