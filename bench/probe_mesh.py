"""The probe mesh's detection: time to an incident per fault kind, localisation right or wrong,
and false incidents per hour of clean running, through the real decision core on a fake clock.

Every node's results are drawn from its pushed plan by the simulated data plane
(``agent.sim.probe_fabric``: ECMP by a hash of the flow, loss per crossing, delay), each fault
injected by its kind in the simulator's fault table (``agent.sim.faults``), one window
per report (the agent's default ``window_s``, 10 s, reported every 5 s: each report carries the
window that closed last); the controller's defaults decide. Detection time is from the fault's
start to its incident opening, on the controller's clock.

    .venv/bin/python -m bench.probe_mesh [--nodes 64] [--per-block 16] [--clean-hours 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from pathlib import Path
from typing import Any

from agent.sim.faults import FAULTS
from agent.sim.probe_fabric import DataPlaneOnly, PlacedFault, SimProbeFabric
from bench.common import quiet_logging, table, write_result
from controller.core import DecisionCore
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

NAME = "probe_mesh"
REPORT_S = 5


class Fleet:
    def __init__(self, workdir: Path, nodes: int, per_block: int, seed: int, name: str) -> None:
        self.fabric = generate_fabric(nodes, gpus_per_node=8, rails=8, nodes_per_block=per_block, spines=8)
        self.clock = FakeClock()
        self.probes = ProbeConfig(enabled=True)
        config = ControllerConfig(
            db_path=workdir / f"{name}-{seed}.db",  # a fresh database: incidents would carry over
            fabric=self.fabric,
            heartbeat_timeout_s=3600.0,
            detection=DetectionConfig(probes=self.probes),
        )
        self.store = Store(config.db_path)
        self.core = DecisionCore(config, self.clock, self.store, ControllerMetrics(), fabric=self.fabric)
        for node in self.fabric.nodes():
            self.core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory()))
        self.sim = SimProbeFabric(self.fabric.leaf_of, self.fabric.spines_of)
        self.rng = random.Random(seed)
        self.seq = 0
        self.t = 0

    def run(self, seconds: int) -> None:
        window = float(self.probes.window_s)
        for _ in range(seconds):
            self.clock.advance(1.0)
            self.t += 1
            if self.t % REPORT_S == 0:
                self.seq += 1
                for node in self.fabric.nodes():
                    plan = self.core.registry.nodes[node].probe_plan
                    if plan is None:
                        continue
                    report = tpb.Report(seq=self.seq, timestamp_ms=self.clock.time_ms())
                    # a window of window_s closes every window_s: every other 5 s report carries one
                    if self.t % int(window) == 0:
                        report.probe_results.extend(self.sim.window_results(plan, self.rng))
                    self.core.report(node, report)
            self.core.tick()

    def first_incident(self, limit_s: int) -> tuple[float | None, list[tuple[str, str]]]:
        started = self.clock.monotonic()
        for _ in range(limit_s):
            self.run(1)
            found = self.core.open_incidents()
            if found:
                return self.clock.monotonic() - started, [(i.kind, i.root_cause) for i in found]
        return None, []

    def close(self) -> None:
        self.store.close()


CASES: list[tuple[str, str, str, dict[str, float], str]] = [
    # name, the simulator's fault kind, its target and parameters, expected (kind, root cause)
    ("leaf 1 % loss", "switch_silent_drop", "leaf-b1-r3", {"loss": 0.01}, "switch_fault leaf-b1-r3"),
    ("leaf 2 % loss", "switch_silent_drop", "leaf-b1-r3", {"loss": 0.02}, "switch_fault leaf-b1-r3"),
    (
        "leaf-spine cable 1 % loss",
        "link_loss",
        "leaf-b2-r1<->spine-5",
        {"loss": 0.01},
        "link_fault leaf-b2-r1<->spine-5",
    ),
    ("NIC cable 1 % loss", "nic_cable_loss", "node-010/nic-4", {"loss": 0.01}, "nic_fault node-010/nic-4"),
    (
        "leaf-spine cable +2 ms",
        "link_delay",
        "leaf-b0-r2<->spine-1",
        {"delay_ms": 2.0},
        "link_fault leaf-b0-r2<->spine-1",
    ),
    ("host +2 ms", "host_net_delay", "node-033", {"delay_ms": 2.0}, "host_fault node-033"),
]


def run(nodes: int, per_block: int, clean_hours: float, repeats: int) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "nodes_per_block": per_block}
    with tempfile.TemporaryDirectory() as tmp:
        for case, (name, kind, target, params, expected) in enumerate(CASES):
            times, right = [], 0
            for r in range(repeats):
                fleet = Fleet(Path(tmp), nodes, per_block, seed=r, name=f"case{case}")
                try:
                    fleet.run(60)  # clean start: every window full
                    FAULTS[kind].inject(DataPlaneOnly(fleet.sim), PlacedFault(target, dict(params)))
                    took, found = fleet.first_incident(180)
                    if took is not None:
                        times.append(took)
                    right += found == [tuple(expected.split(" "))]
                finally:
                    fleet.close()
            out[f"{name}: detect_s_median"] = round(statistics.median(times), 1) if times else None
            out[f"{name}: localised_right"] = f"{right}/{repeats}"
        fleet = Fleet(Path(tmp), nodes, per_block, seed=99, name="clean")
        try:
            fleet.run(int(clean_hours * 3600))
            false = len(fleet.core.detection.correlator.incidents(active_only=False, limit=100_000))
        finally:
            fleet.close()
        out["clean_hours"] = clean_hours
        out["false_incidents_per_hour"] = round(false / clean_hours, 2)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--per-block", type=int, default=16)
    ap.add_argument("--clean-hours", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    quiet_logging()
    figures = run(args.nodes, args.per_block, args.clean_hours, args.repeats)
    print(table("probe mesh: detection and localisation (fake clock, simulated data plane)", list(figures.items())))
    params = {k: v for k, v in vars(args).items()}
    print(f"wrote {write_result(NAME, params, figures)}")
    return figures


if __name__ == "__main__":
    main()
