"""The probe mesh's smaller gaps (issue 29, session 13), measured through the real decision core
on a fake clock, each node's results drawn from its pushed plan by the simulated data plane:

- ``restart``: 1 % loss on a leaf, the controller restarted 5 s after the fault starts (every
  agent reconnects, no prober restarted): seconds from the restart to the incident, against the
  same fault on a steady mesh (from its start);
- ``first``: 1 % loss on a leaf: which incident opens first (the leaf's ``switch_fault``, or a
  ``path_fault`` above it), and when, with small rings (3 NICs under each leaf) and larger (8);
- ``slow``: a fabric whose every round trip is 600-900 us (over the 500 us threshold): incidents
  in its clean minutes, and the seconds to name one cable adding 2 ms on it.

    .venv/bin/python -m bench.probe_gaps [--seeds 10] [--only restart|first|slow]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

from agent.sim.probe_fabric import SimProbeFabric
from bench.common import table, write_result
from controller.core import DecisionCore
from controller.detect.correlate import CorrelationConfig
from controller.detect.pipeline import DetectionConfig
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig
from controller.metrics import ControllerMetrics
from controller.settings import ControllerConfig
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.core.logs import configure_logging
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

NAME = "probe_gaps"
LEAF = "leaf-b1-r0"
PROBES = ProbeConfig(enabled=True, window_s=5, replan_min_s=0)  # reports every 5 s carry a 5 s window


class Fleet:
    """32 nodes, 2 rails, 4 spines; agents that outlive their controller (start stamps, last plans)."""

    def __init__(self, workdir: Path, seed: int, *, per_block: int = 8, base_us: float = 8.0, spread_us: float = 1.0):
        self.fabric = generate_fabric(32, gpus_per_node=2, rails=2, nodes_per_block=per_block, spines=4)
        self.clock = FakeClock()
        self.db = workdir / f"c-{seed}-{per_block}-{int(base_us)}.db"
        self.sim = SimProbeFabric(self.fabric.leaf_of, self.fabric.spines_of, base_rtt_us=base_us, spread_us=spread_us)
        self.rng = random.Random(seed)
        self.seq = self.t = 0
        self.started_ms = self.clock.time_ms() - 1000
        self.tries: dict[str, int] = dict.fromkeys(self.fabric.nodes(), 0)
        self.plans: dict[str, spb.ProbePlan] = {}
        self.opened: list[tuple[str, str]] = []
        self.store = Store(self.db)
        self.core = self._core()
        self._hellos()

    def _core(self) -> DecisionCore:
        config = ControllerConfig(
            db_path=self.db,
            fabric=self.fabric,
            heartbeat_timeout_s=3600.0,
            detection=DetectionConfig(correlation=CorrelationConfig(settle_s=2.0), probes=PROBES),
        )
        return DecisionCore(config, self.clock, self.store, ControllerMetrics(), fabric=self.fabric)

    def _hellos(self) -> None:
        nics = [ipb.NicInfo(rdma_device=f"mlx5_{r}", port=1, netdev=f"rail{r}", paired_gpu_index=r) for r in range(2)]
        for node in self.fabric.nodes():
            self.tries[node] += 1
            generation = self.started_ms * 1000 + self.tries[node]  # as agent.transport.link stamps it
            hello = spb.Hello(node_id=node, role=ipb.NODE_ROLE_COMPUTE, stream_generation=generation)
            hello.inventory.CopyFrom(ipb.Inventory(nics=nics))
            self.core.hello(hello)

    def restart_controller(self) -> None:
        self.store.close()
        self.store = Store(self.db)
        self.core = self._core()
        self._hellos()

    def run(self, seconds: int) -> None:
        for _ in range(seconds):
            self.clock.advance(1.0)
            self.t += 1
            if self.t % 5 == 0:
                self.seq += 1
                for node in self.fabric.nodes():
                    given = self.core.registry.nodes[node].probe_plan
                    if given is not None:
                        self.plans[node] = given
                    if node in self.plans:
                        report = tpb.Report(seq=self.seq, timestamp_ms=self.clock.time_ms())
                        report.probe_results.extend(self.sim.window_results(self.plans[node], self.rng))
                        self.core.report(node, report)
            self.core.tick()
            for inc in self.core.open_incidents():
                if (inc.kind, inc.root_cause) not in self.opened:
                    self.opened.append((inc.kind, inc.root_cause))

    def until_incident(self, limit_s: int) -> int | None:
        for t in range(1, limit_s + 1):
            self.run(1)
            if self.opened:
                return t
        return None


def restart(workdir: Path, seeds: int) -> list[dict[str, Any]]:
    usual, after = [], []
    for seed in range(seeds):
        steady = Fleet(workdir / "steady", seed)
        steady.run(40)
        steady.sim.inject_loss(LEAF, 0.01)
        usual.append(steady.until_incident(120))
        fleet = Fleet(workdir / "restart", seed)
        fleet.run(40)
        fleet.sim.inject_loss(LEAF, 0.01)
        fleet.run(5)
        fleet.restart_controller()
        after.append(fleet.until_incident(120))
    return [
        {"case": "steady mesh, from the fault's start", "seconds": _spread(usual)},
        {"case": "controller restarted 5 s into the fault, from the restart", "seconds": _spread(after)},
    ]


def first(workdir: Path, seeds: int) -> list[dict[str, Any]]:
    rows = []
    for per_block in (3, 8):
        kinds: Counter[str] = Counter()
        times = []
        for seed in range(seeds):
            fleet = Fleet(workdir / "first", seed, per_block=per_block)
            fleet.run(40)
            fleet.sim.inject_loss(LEAF, 0.01)
            times.append(fleet.until_incident(120))
            kinds[fleet.opened[0][0] if fleet.opened else "none"] += 1
        rows.append({"NICs under a leaf": per_block, "first incident": dict(kinds), "seconds": _spread(times)})
    return rows


def slow(workdir: Path, seeds: int) -> list[dict[str, Any]]:
    false, named, times = 0, 0, []
    for seed in range(seeds):
        fleet = Fleet(workdir / "slow", seed, base_us=600.0, spread_us=300.0)
        fleet.run(150)
        false += len(fleet.opened)
        cable = fleet.fabric.link_name("leaf-b1-r0", "spine-2")
        fleet.opened.clear()
        fleet.sim.inject_delay(cable, 0.002)
        times.append(fleet.until_incident(120))
        named += fleet.opened[:1] == [("link_fault", cable)]
    return [
        {
            "fabric": "every round trip 600-900 us",
            "incidents in 150 clean s (all seeds)": false,
            "2 ms cable named first": f"{named}/{seeds}",
            "seconds": _spread(times),
        }
    ]


def _spread(values: list[int | None]) -> str:
    got = sorted(v for v in values if v is not None)
    missed = len(values) - len(got)
    if not got:
        return f"none of {len(values)}"
    text = f"median {statistics.median(got):g}, {got[0]}-{got[-1]}"
    return text + (f", {missed} missed" if missed else "")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="bench.probe_gaps", description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--only", choices=["restart", "first", "slow"])
    args = parser.parse_args(argv)
    configure_logging("error")  # the localiser's warnings are what is measured, not news
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for name, part in (("restart", restart), ("first", first), ("slow", slow)):
            if args.only in (None, name):
                (workdir / name).mkdir()
                out[name] = part(workdir / name, args.seeds)
                for row in out[name]:
                    print(table(f"{name}", [(str(k), str(v)) for k, v in row.items()]))
    write_result(NAME, {"seeds": args.seeds, "only": args.only}, out)
    return out


if __name__ == "__main__":
    main()
