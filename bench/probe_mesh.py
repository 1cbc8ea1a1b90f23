"""The probe mesh's detection: time to an incident per fault kind, localisation right or wrong,
and false incidents per hour of clean running, through the real decision core on a fake clock.

Every node's results are drawn from its pushed plan by the simulated data plane
(``agent.sim.probe_fabric``: ECMP by a hash of the flow, loss per crossing, delay), each fault
injected by its kind in the simulator's fault table (``agent.sim.faults``), one window
per report (the agent's default ``window_s``, 10 s, reported every 5 s: each report carries the
window that closed last); the controller's defaults decide. Detection time is from the fault's
start to its incident opening, on the controller's clock.

The clean run counts false incidents per hour: the whole probe path on a fabric with no fault,
the planner's plans pushed on Hello, every node's windows decided (in detection shard processes
with ``--detect-workers``, the production path at scale: decoded there, carried back in the
verdict), the localiser's running sums and vote every 5 s, persistence before a condition and
hysteresis before it resolves. ``--stray-loss`` adds a clean fabric's background: each flow loses
one probe in a window with that chance (reported alone with its source port, as the prober
does). Besides incidents it reports the localisations that blamed anything and the probe
conditions opened: the margin under the persistence that keeps them from becoming incidents.

    .venv/bin/python -m bench.probe_mesh [--nodes 64] [--per-block 16] [--clean-hours 1] [--repeats 3]
        [--clean-only] [--detect-workers N] [--stray-loss P]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import tempfile
import time
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
    def __init__(
        self,
        workdir: Path,
        nodes: int,
        per_block: int,
        seed: int,
        name: str,
        workers: int = 0,
        stray_loss: float = 0.0,
    ) -> None:
        self.fabric = generate_fabric(nodes, gpus_per_node=8, rails=8, nodes_per_block=per_block, spines=8)
        self.clock = FakeClock()
        self.probes = ProbeConfig(enabled=True)
        config = ControllerConfig(
            db_path=workdir / f"{name}-{seed}.db",  # a fresh database: incidents would carry over
            fabric=self.fabric,
            heartbeat_timeout_s=3600.0,
            detection=DetectionConfig(probes=self.probes, workers=workers),
        )
        self.store = Store(config.db_path)
        self.core = DecisionCore(config, self.clock, self.store, ControllerMetrics(), fabric=self.fabric)
        self.sim = SimProbeFabric(self.fabric.leaf_of, self.fabric.spines_of)
        self.rng = random.Random(seed)
        self.stray_loss = stray_loss
        self.seq = 0
        self.t = 0
        self.results = 0
        self.strays = 0
        self.blamed_localisations = 0
        self.probe_conditions = 0
        self._last_blames: object = None

    async def start(self) -> None:
        """Detection's shard processes (with workers), then every node's Hello (plans pushed)."""
        await self.core.start_shards()
        for node in self.fabric.nodes():
            self.core.hello(spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, inventory=ipb.Inventory()))

    async def run(self, seconds: int) -> None:
        window = float(self.probes.window_s)
        shards = self.core.detection.shards
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
                        report.probe_results.extend(self._window(plan))
                    self.core.report(node, report)
                if shards is not None:  # every verdict back before the clock moves on
                    shards.flush()
                    while shards.in_flight:  # noqa: ASYNC110 (the shards signal no drain; verdicts come on this loop)
                        await asyncio.sleep(0.001)
            opened = len(self._probe_conditions())
            self.core.tick()
            localising = self.core.detection.probe_localising
            if localising is not None:  # with shards it runs beside the loop: done before the clock moves on
                await localising
            self._count(opened)

    def _window(self, plan: spb.ProbePlan) -> list[tpb.ProbeResult]:
        results = self.sim.window_results(plan, self.rng)
        if self.stray_loss > 0:
            flows = {t.local_nic + "|" + t.peer_nic: len(t.src_ports) for t in plan.targets}
            for r in list(results):
                if (
                    r.src_port
                    or r.sent < 2
                    or self.rng.random() >= self.stray_loss * flows.get(r.local_nic + "|" + r.peer_nic, 1)
                ):
                    continue
                # one flow lost one probe: reported alone with its source port, as the prober does
                share = max(1, r.sent // max(1, flows.get(r.local_nic + "|" + r.peer_nic, 1)))
                r.sent -= share
                results.append(
                    tpb.ProbeResult(
                        local_nic=r.local_nic,
                        peer_nic=r.peer_nic,
                        src_port=49152 + self.rng.randrange(64),
                        sent=share,
                        lost=1,
                        rtt_p50_us=r.rtt_p50_us,
                        rtt_p99_us=r.rtt_p99_us,
                        responder_us=r.responder_us,
                        plan_version=r.plan_version,
                        window_ms=r.window_ms,
                    )
                )
                self.strays += 1
        self.results += len(results)
        return results

    def _probe_conditions(self) -> list[object]:
        loc = self.core.detection.probes
        return list(loc.open_conditions()) if loc is not None else []

    def _count(self, opened_before: int) -> None:
        loc = self.core.detection.probes
        if loc is None:
            return
        if loc.last_blames is not self._last_blames:  # a localisation ran this tick
            self._last_blames = loc.last_blames
            self.blamed_localisations += bool(loc.last_blames)
        self.probe_conditions += max(0, len(self._probe_conditions()) - opened_before)

    async def first_incident(self, limit_s: int) -> tuple[float | None, list[tuple[str, str]]]:
        started = self.clock.monotonic()
        for _ in range(limit_s):
            await self.run(1)
            found = self.core.open_incidents()
            if found:
                return self.clock.monotonic() - started, [(i.kind, i.root_cause) for i in found]
        return None, []

    async def close(self) -> None:
        await self.core.stop_shards()
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


async def run(
    nodes: int,
    per_block: int,
    clean_hours: float,
    repeats: int,
    *,
    clean_only: bool = False,
    workers: int = 0,
    stray_loss: float = 0.0,
) -> dict[str, Any]:
    out: dict[str, Any] = {"nodes": nodes, "nodes_per_block": per_block, "detect_workers": workers}
    with tempfile.TemporaryDirectory() as tmp:
        for case, (name, kind, target, params, expected) in enumerate([] if clean_only else CASES):
            times, right = [], 0
            for r in range(repeats):
                fleet = Fleet(Path(tmp), nodes, per_block, seed=r, name=f"case{case}", workers=workers)
                try:
                    await fleet.start()
                    await fleet.run(60)  # clean start: every window full
                    FAULTS[kind].inject(DataPlaneOnly(fleet.sim), PlacedFault(target, dict(params)))
                    took, found = await fleet.first_incident(180)
                    if took is not None:
                        times.append(took)
                    right += found == [tuple(expected.split(" "))]
                finally:
                    await fleet.close()
            out[f"{name}: detect_s_median"] = round(statistics.median(times), 1) if times else None
            out[f"{name}: localised_right"] = f"{right}/{repeats}"
        fleet = Fleet(Path(tmp), nodes, per_block, seed=99, name="clean", workers=workers, stray_loss=stray_loss)
        started = time.perf_counter()
        try:
            await fleet.start()
            await fleet.run(int(clean_hours * 3600))
            incidents = fleet.core.detection.correlator.incidents(active_only=False, limit=100_000)
        finally:
            await fleet.close()
        out["clean_hours"] = clean_hours
        out["clean_stray_loss_per_flow_window"] = stray_loss
        out["clean_probe_results"] = fleet.results
        out["clean_stray_lost_flows"] = fleet.strays
        out["clean_localisations_blaming_anything"] = fleet.blamed_localisations
        out["clean_probe_conditions_opened"] = fleet.probe_conditions
        out["clean_incidents"] = sorted(f"{i.kind} {i.root_cause}" for i in incidents)
        out["false_incidents_per_hour"] = round(len(incidents) / clean_hours, 2)
        out["clean_wall_s"] = round(time.perf_counter() - started, 1)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=64)
    ap.add_argument("--per-block", type=int, default=16)
    ap.add_argument("--clean-hours", type=float, default=1.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--clean-only", action="store_true", help="only the clean run (no fault cases)")
    ap.add_argument(
        "--detect-workers", type=int, default=0, help="decide reports in this many detection shard processes"
    )
    ap.add_argument(
        "--stray-loss",
        type=float,
        default=0.0,
        help="clean run: the chance each flow loses one probe in a window (a clean fabric's background)",
    )
    args = ap.parse_args(argv)
    for flag, value, low, high in (
        ("--nodes", args.nodes, 2, 100_000),
        ("--per-block", args.per_block, 1, 1024),
        ("--repeats", args.repeats, 1, 100),
        ("--detect-workers", args.detect_workers, 0, 64),
    ):
        if not low <= value <= high:
            ap.error(f"{flag} must be between {low} and {high}, got {value}")
    if not 0.0 <= args.stray_loss < 0.05:
        ap.error(f"--stray-loss must be in [0, 0.05), got {args.stray_loss}")
    if args.clean_hours <= 0:
        ap.error(f"--clean-hours must be > 0, got {args.clean_hours}")
    quiet_logging()
    figures = asyncio.run(
        run(
            args.nodes,
            args.per_block,
            args.clean_hours,
            args.repeats,
            clean_only=args.clean_only,
            workers=args.detect_workers,
            stray_loss=args.stray_loss,
        )
    )
    print(table("probe mesh: detection and localisation (fake clock, simulated data plane)", list(figures.items())))
    params = {k: v for k, v in vars(args).items()}
    print(f"wrote {write_result(NAME, params, figures)}")
    return figures


if __name__ == "__main__":
    main()
