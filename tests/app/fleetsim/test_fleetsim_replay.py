"""The simulator decides with the controller's objects, not a copy: one trace, two drivers, same decisions.

A recorded trace of 25 faults (GPU Xids, ECC errors, NIC and cable faults; bursts that spend
the eviction budget and trip the breaker; more evictions than spares) is played
1. through the controller service (``Controller``: its gRPC and HTTP servers up, its sweep
   loop, grouping task and healer loop running) on a FakeClock, the faults fed as condition
   changes to its decision core at their times, and
2. through ``starpulse simulate``'s engine, which jumps its clock from event to event.
Both make the same decisions: per incident, the action, the node, the guards' verdict and
its reason; and the same evictions with the same spares.
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

from controller.detect.model import ConditionChange
from controller.detect.rules import load_rules
from controller.heal.guards import GuardConfig
from controller.heal.healer import HealConfig
from controller.heal.policy import default_policy_path
from controller.heal.scheduler.sim import SimScheduler
from controller.service import Controller
from controller.settings import ControllerConfig, HealSettings
from starpulse.app.fleetsim.engine import START_MS, Fault, JobSpec, SimSettings, fault_conditions, sim_fabric, simulate
from starpulse.app.fleetsim.mix import load_mix
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from tests.helpers import free_port

GUARDS = GuardConfig(
    max_evictions_per_window=4, window_s=600.0, max_fleet_share=0.6, breaker_trip_incidents=6, breaker_window_s=300.0
)
SETTINGS = SimSettings(
    nodes=32, spares=2, days=0.1, planned=False, manual_s=30 * 86400.0,  # nobody resets the breaker in the trace
    jobs=(JobSpec("train-a", 12, restart_overhead_s=120.0), JobSpec("train-b", 12, restart_overhead_s=120.0)),
)  # fmt: skip
CAUSES = ["xid79", "dbe", "nic", "cable"]


def _trace() -> list[Fault]:
    """25 faults on distinct nodes: 8 at 100 s apart (the budget: 4 per 10 min), a burst of 9
    within 3 minutes (the breaker: 6 evictable incidents in 5 min), then 8 more while it is open."""
    times = [100.0 * (i + 1) for i in range(8)] + [2000.0 + 20 * i for i in range(9)]
    times += [4000.0 + 200 * i for i in range(8)]
    return [Fault(t, f"node-{i:03d}", CAUSES[i % len(CAUSES)]) for i, t in enumerate(times)]


def _files(tmp_path: Path) -> tuple[Path, Path]:
    """The mix (repairs far beyond the trace: no node comes back in either run) and a policy whose
    repair rungs wait a day for agents that never answer (the service's repair loop then waits too;
    the simulator plays the same rungs with the same limits)."""
    mix = tmp_path / "mix.yaml"
    rows = [("xid79", "gpu", "gpu.xid.reboot", "gpu"), ("dbe", "hbm_ecc", "gpu.ecc_dbe", "gpu"),
            ("nic", "nic", "nic.port_down", "nic"), ("cable", "switch_cable", "switch.port_down", "cable")]  # fmt: skip
    # the ladder played as the service's agents answer here: never (a rung's round trip outlasts
    # its day-long limit, past the trace), so the rungs are entered in both runs and end in neither
    ladder = "".join(f"  {r}: {{value: 172800, source: t}}\n" for r in ("reset_gpu", "reboot", "scan"))
    mix.write_text(
        "source: replay test\ndays: 1\ngpus: 1000\n"
        + f"ladder:\n{ladder}  fixed_by: {{reboot: 1}}\n  fixed_by_source: t\n"
        + "causes:\n"
        + "".join(
            f"  - {{name: {n}, cause: {c}, count: 1, rule: {r}, component: {k}, repair_h: 1000, repair_source: t}}\n"
            for n, c, r, k in rows
        )
    )
    policy = tmp_path / "policy.yaml"
    policy.write_text(default_policy_path().read_text() + "\nrepair:\n  timeouts: {reset_gpu: 1d, reboot: 1d}\n")
    return mix, policy


def _key(decision: dict[str, object]) -> tuple[object, ...]:
    """A decision as compared; how long the breaker has been open is read off each driver's clock
    (the service's loops tick every second, the simulator jumps): that number may differ by one."""
    reason = re.sub(r"open for \d+ s", "open for N s", str(decision["reason"]))
    return (*(decision[k] for k in ("incident", "kind", "action", "node", "outcome")), reason)


async def _through_the_service(tmp_path: Path, policy: Path, trace: list[Fault]) -> tuple[list, list]:  # type: ignore[type-arg]
    fabric = sim_fabric(SETTINGS)
    scheduler = SimScheduler(list(fabric.nodes()))
    working = [n for n in fabric.nodes() if not fabric.is_spare(n)]
    at = 0
    for spec in SETTINGS.jobs:
        scheduler.add_job(spec.name, working[at : at + spec.nodes])
        at += spec.nodes
    clock = FakeClock(start_ms=START_MS)
    config = ControllerConfig(
        listen=f"127.0.0.1:{free_port()}",
        http="127.0.0.1:0",
        db_path=tmp_path / "service.db",
        fabric=fabric,
        heartbeat_timeout_s=10 * 365 * 86400.0,
        heal=HealSettings(scheduler, policy_path=policy, guards=GUARDS, heal=HealConfig(checkpoint_timeout_s=0.0)),
    )
    ctl = Controller(config, clock=clock)
    await ctl.start()
    try:
        inventory = ipb.Inventory(gpus=[ipb.GpuInfo(index=i) for i in range(SETTINGS.gpus_per_node)])
        for node in fabric.nodes():
            ctl.core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=inventory, boot_id="b"))
        for name, job in scheduler.jobs.items():
            ctl.core.jobs.register_job(name, job.nodes, world_size=len(job.nodes) * SETTINGS.gpus_per_node)
        rules = {r.id: r for r in load_rules(None).rules}
        mix = {c.name: c for c in load_mix(tmp_path / "mix.yaml").causes}
        for fault in trace:
            await clock.run_for(START_MS / 1000 + fault.at_s - clock.time())
            conditions = fault_conditions(fabric, rules, mix[fault.cause], fault.node, clock.time_ms())
            ctl.core.feed([ConditionChange("opened", c) for c in conditions])
            await clock.run_for(config.detection.correlation.settle_s + 1.0)
            for name, job in scheduler.jobs.items():  # the ranks tell the registry where each job runs now
                if job.state == "running":
                    ctl.core.jobs.register_job(name, job.nodes)
        assert ctl.healer is not None
        evictions = [(e.node, e.incident, e.replacement) for e in ctl.healer.evictions]
        return list(ctl.healer.decisions), evictions
    finally:
        await ctl.stop()


async def test_the_service_and_the_simulator_make_the_same_decisions(tmp_path: Path) -> None:
    mix_path, policy = _files(tmp_path)
    trace = _trace()
    assert len(trace) >= 20
    service_decisions, service_evictions = await _through_the_service(tmp_path, policy, trace)
    base = ControllerConfig(heal=HealSettings(SimScheduler([]), policy_path=policy, guards=GUARDS))
    sim = await asyncio.to_thread(simulate, SETTINGS, load_mix(mix_path), base, trace)

    assert [_key(d) for d in sim.decisions] == [_key(d) for d in service_decisions]
    outcomes = {d["outcome"] for d in sim.decisions}
    assert {"ok", "budget", "breaker_open"} <= outcomes  # the trace reaches a guard and the breaker
    assert sim.breaker_trips == 1
    assert sim.evictions_without_spare >= 1  # more evictions of working nodes than spares
    assert sim.spares_used == 2
    assert len(service_evictions) == sim.evictions
    assert sum(1 for _, _, spare in service_evictions if spare) == sim.spares_used
