"""Probe-mesh planning at fleet size: how long one replan takes and what it asks of each NIC.

The controller replans when the fleet or the fabric changes (at most every
``detection.probes.replan_min_s``); this times ``plan_mesh`` over a generated rail-optimised
fabric and the building of every node's pushed ``ProbePlan`` (median of ``--repeats``), and
reports targets, flows per target, packets per second per NIC and the largest plan message.

    .venv/bin/python -m bench.probe_plan [--nodes 2048] [--per-block 32] [--spines 8] [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import quiet_logging, table, write_result
from controller.detect.probes import ProbeLocaliser, ProbeObs
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig, plan_mesh
from starpulse.core.clock import FakeClock

NAME = "probe_plan"


def run(nodes: int, per_block: int, spines: int, repeats: int) -> dict[str, Any]:
    fabric = generate_fabric(nodes, nodes_per_block=per_block, spines=spines)
    config = ProbeConfig(enabled=True)
    plan_s, push_s = [], []
    plan = None
    largest = 0
    for version in range(1, repeats + 1):
        started = time.perf_counter()
        plan = plan_mesh(fabric, config, version=version)
        plan_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        wires = [plan.for_node(n, config) for n in fabric.nodes()]
        push_s.append(time.perf_counter() - started)
        largest = max(len(w.SerializeToString()) for w in wires)
    assert plan is not None
    first_s, localise_s, observations = _localise(fabric, config, plan)
    sent = plan.sent_pps()
    targets = [t for ts in plan.targets.values() for t in ts]
    return {
        "nodes": nodes,
        "nics": len(fabric.nics()),
        "leaf_spine_links": sum(len(fabric.spines_of(leaf)) for leaf in fabric.leaves()),
        "plan_s_median": round(statistics.median(plan_s), 3),
        "build_messages_s_median": round(statistics.median(push_s), 3),
        "targets": len(targets),
        "flows_per_target": len(targets[0].src_ports) if targets else 0,
        "pps_per_nic_max": round(max(sent.values()), 2),
        "pps_fleet_total": round(sum(sent.values()), 1),
        "largest_plan_bytes": largest,
        "localise_observations": observations,
        "localise_first_s": round(first_s, 3),  # paths worked out (after a replan or LLDP change)
        "localise_s": round(localise_s, 3),  # every localise_every (5 s) after
    }


def _localise(fabric: Any, config: ProbeConfig, plan: Any) -> tuple[float, float, int]:
    """One localisation over a full clean window: every target's summed result, three windows of it."""
    clock = FakeClock()
    loc = ProbeLocaliser(fabric, config, clock=clock)
    count = 0
    for _ in range(int(config.localise_window_s // config.window_s)):
        clock.advance(config.window_s)
        for node, targets in plan.targets.items():
            obs = [ProbeObs(t.local_nic, t.peer_nic, "", 200, 0, 12.0, 3.0, False) for t in targets]
            loc.add(node, obs)
            count += len(obs)
    started = time.perf_counter()
    loc.localise()
    first = time.perf_counter() - started  # paths worked out and cached
    started = time.perf_counter()
    loc.localise()
    return first, time.perf_counter() - started, count


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--per-block", type=int, default=32)
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    quiet_logging()
    figures = run(args.nodes, args.per_block, args.spines, args.repeats)
    print(table("probe mesh planning", list(figures.items())))
    params = {"nodes": args.nodes, "per_block": args.per_block, "spines": args.spines, "repeats": args.repeats}
    print(f"wrote {write_result(NAME, params, figures)}")
    return figures


if __name__ == "__main__":
    main()
