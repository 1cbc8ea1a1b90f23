"""Fabric build time and root-cause grouping time, 256 to 2,048 nodes (16,384 GPUs).

* build: ``generate_fabric(N, 8, 8, 16, 8)`` (networkx graph + every index detection uses).
* grouping: one realistic batch of concurrent faults, as Conditions named like the
  condition engine names them:
    - a leaf down: ``nic.port_down`` on the NIC of all 16 nodes cabled to one leaf;
    - a spine down: ``switch.port_down`` on every leaf's uplink port toward that spine
      (one per leaf: N/16 x 8 leaves) plus ``switch.silent`` on the spine;
    - 50 lone NIC faults (each on a different leaf, so none is a leaf fault);
    - 100 GPU faults (Xid 79, one GPU on each of 100 distinct nodes);
    - a partition: heartbeats lost on the 64 nodes of 4 whole blocks.
  Timed: ``Grouper(fabric, CorrelationConfig(), fleet_size).group(conditions)`` (pure), and
  the full ``Correlator.on_changes`` + ``tick`` (settle, group, open incidents) on an
  in-memory SQLite ``IncidentStore`` - a fresh correlator and store per repetition.

    .venv/bin/python -m bench.fabric [--quick] [--sizes 256 512 1024 2048]
"""

from __future__ import annotations

import argparse
import gc
import random
import sqlite3
import time
from collections import Counter
from typing import Any

from bench.common import median, quiet_logging, table, write_result
from starpulse.core.clock import FakeClock

NAME = "fabric"
NODES_PER_BLOCK = 16
RAILS = 8
GPUS = 8
SPINES = 8


def _cond(rule: str, component: str, ctype: str, category: str, node: str | None, severity: str,
          action: str, message: str, now: int, **evidence: Any) -> Any:  # fmt: skip
    from controller.detect.model import Condition

    return Condition(
        rule=rule,
        component=component,
        component_type=ctype,  # type: ignore[arg-type]
        category=category,
        node=node,
        severity=severity,  # type: ignore[arg-type]
        action=action,
        message=message,
        first_seen_ms=now,
        last_seen_ms=now,
        evidence=dict(evidence),
    )


def fault_batch(fabric: Any, now: int, seed: int = 1) -> tuple[list[Any], dict[str, int]]:
    """The conditions of one bad minute on this fabric, and how many of each fault went in."""
    rng = random.Random(seed)
    nodes = fabric.nodes()
    blocks = fabric.blocks()
    conds: list[Any] = []
    # Leaf down: block 0, rail 3.
    leaf = f"leaf-b{blocks[0]}-r3"
    for nic in fabric.nics_on_leaf(leaf):
        host = fabric.host_of(nic)
        conds.append(_cond("nic.port_down", nic, "nic", "nic_link", host, "critical", "check_link",
                           "RDMA port is DOWN (expected ACTIVE)", now))  # fmt: skip
    # Spine down: every leaf's uplink port toward spine-3, and the spine's agent silent.
    spine = fabric.spines()[3]
    uplinks = 0
    for lf in fabric.leaves_of(spine):
        port = next(p for k in range(NODES_PER_BLOCK, NODES_PER_BLOCK + SPINES)
                    if fabric.peer_at(lf, (p := f"Ethernet{4 * k}")) == spine)  # fmt: skip
        conds.append(_cond("switch.port_down", f"{lf}:{port}", "switch", "switch_port", None, "critical",
                           "check_link", "port oper down, admin up", now, peer=spine))  # fmt: skip
        uplinks += 1
    conds.append(_cond("switch.silent", spine, "switch", "switch", None, "critical", "investigate",
                       "switch agent silent for 30s", now, silent=True))  # fmt: skip
    # Partition: the 64 nodes of blocks 1-4.
    part_blocks = blocks[1:5]
    part_nodes = [n for b in part_blocks for n in fabric.nodes_in_block(b)]
    for n in part_nodes:
        conds.append(_cond("node.heartbeat_lost", n, "node", "heartbeat", n, "critical", "investigate",
                           "no report for 15s", now))  # fmt: skip
    # 50 lone NIC faults on 50 distinct leaves outside the blocks used above.
    spare_blocks = blocks[5:]
    leaves = [(b, r) for b in spare_blocks for r in range(RAILS)]
    lone = rng.sample(leaves, min(50, len(leaves)))
    used_nodes: set[str] = set()
    for b, r in lone:
        n = rng.choice(fabric.nodes_in_block(b))
        used_nodes.add(n)
        conds.append(_cond("nic.port_down", f"{n}/nic-{r}", "nic", "nic_link", n, "critical", "check_link",
                           "RDMA port is DOWN (expected ACTIVE)", now))  # fmt: skip
    # 100 GPU faults on 100 distinct nodes (not the lone-NIC nodes).
    pool = [n for b in spare_blocks for n in fabric.nodes_in_block(b) if n not in used_nodes]
    for n in rng.sample(pool, min(100, len(pool))):
        g = rng.randrange(GPUS)
        conds.append(_cond("gpu.xid.reboot", f"{n}/gpu-{g}", "gpu", "gpu", n, "fatal", "reboot",
                           "Xid 79: GPU has fallen off the bus", now, xid=79))  # fmt: skip
    counts = {
        "leaf_nic_down": len(fabric.nics_on_leaf(leaf)),
        "spine_uplinks_down": uplinks,
        "partition_nodes": len(part_nodes),
        "lone_nic": len(lone),
        "gpu": min(100, len(pool)),
        "conditions": len(conds),
        "fleet_nodes": len(nodes),
    }
    return conds, counts


def timed(fn: Any, reps: int) -> tuple[list[float], Any]:
    times: list[float] = []
    result = None
    for _ in range(reps):
        gc.collect()
        t0 = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t0)
    return times, result


def bench_size(n: int, build_reps: int, group_reps: int) -> dict[str, Any]:
    from controller.detect.correlate import CorrelationConfig, Correlator, Grouper
    from controller.detect.incidents import IncidentStore
    from controller.detect.model import ConditionChange
    from controller.fabric import generate_fabric

    build_times, fabric = timed(lambda: generate_fabric(n, GPUS, RAILS, NODES_PER_BLOCK, SPINES), build_reps)
    clock = FakeClock()
    conds, counts = fault_batch(fabric, clock.time_ms())
    fleet = len(fabric.nodes())
    cfg = CorrelationConfig()
    grouper = Grouper(fabric, cfg, lambda: fleet)
    group_times, groups = timed(lambda: grouper.group(conds), group_reps)
    kinds = Counter(g.kind for g in groups)

    corr_times: list[float] = []
    on_changes_times: list[float] = []
    tick_times: list[float] = []
    opened = 0
    for _ in range(group_reps):
        conn = sqlite3.connect(":memory:", isolation_level=None)
        clk = FakeClock()
        corr = Correlator(fabric, IncidentStore(conn), CorrelationConfig(), fleet_size=lambda: fleet, clock=clk)
        changes = [ConditionChange("opened", c) for c in conds]
        gc.collect()
        t0 = time.perf_counter()
        corr.on_changes(changes)
        t1 = time.perf_counter()
        clk.advance(cfg.settle_s + 0.001)
        out = corr.tick()
        t2 = time.perf_counter()
        on_changes_times.append(t1 - t0)
        tick_times.append(t2 - t1)
        corr_times.append(t2 - t0)
        opened = sum(1 for ch, _ in out if ch == "opened")
        conn.close()
    ms = 1000.0
    return {
        "nodes": n,
        "gpus": n * GPUS,
        "vertices": fabric.graph.number_of_nodes(),
        "edges": fabric.graph.number_of_edges(),
        "build_s_median": round(median(build_times), 3),
        "build_s_all": [round(t, 3) for t in build_times],
        "faults": counts,
        "group_ms_median": round(median(group_times) * ms, 2),
        "group_ms_all": [round(t * ms, 2) for t in group_times],
        "groups": sum(kinds.values()),
        "group_kinds": dict(sorted(kinds.items())),
        "correlator_ms_median": round(median(corr_times) * ms, 2),
        "correlator_on_changes_ms_median": round(median(on_changes_times) * ms, 3),
        "correlator_tick_ms_median": round(median(tick_times) * ms, 2),
        "incidents_opened": opened,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(prog="python -m bench.fabric", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="sizes 256 and 2048 only; build once")
    ap.add_argument("--sizes", type=int, nargs="*", default=None, help="node counts (256 512 1024 2048)")
    args = ap.parse_args(argv)
    sizes = args.sizes or ([256, 2048] if args.quick else [256, 512, 1024, 2048])
    quiet_logging()
    results = []
    for n in sizes:
        big = n == max(sizes)
        build_reps = 3 if big and not args.quick else 1
        results.append(bench_size(n, build_reps, 5))
    top = results[-1]
    rows: list[tuple[str, Any]] = [
        (f"fabric {top['nodes']} nodes: vertices / edges", f"{top['vertices']:,} / {top['edges']:,}"),
        (f"build s, median of {len(top['build_s_all'])}", top["build_s_median"]),
        ("conditions in the fault batch", top["faults"]["conditions"]),
        ("Grouper.group ms, median of 5", top["group_ms_median"]),
        ("Correlator on_changes + tick ms, median of 5", top["correlator_ms_median"]),
        ("  of which tick (group + open incidents in SQLite)", top["correlator_tick_ms_median"]),
        ("groups / incidents opened", f"{top['groups']} / {top['incidents_opened']}"),
        ("group kinds", ", ".join(f"{k} {v}" for k, v in top["group_kinds"].items())),
    ]
    print(table(f"fabric @ {top['nodes']} nodes ({top['gpus']:,} GPUs)", rows))
    print("\nscaling (build: 1 run below the largest size; group/correlate: median of 5)")
    print(f"  {'nodes':>6} {'GPUs':>7} {'conds':>6} {'build s':>8} {'group ms':>9} ", end="")
    print(f"{'correlate ms':>13} {'incidents':>9}")
    for r in results:
        print(
            f"  {r['nodes']:>6} {r['gpus']:>7,} {r['faults']['conditions']:>6} {r['build_s_median']:>8.3f} "
            f"{r['group_ms_median']:>9.2f} {r['correlator_ms_median']:>13.2f} {r['incidents_opened']:>9}"
        )
    path = write_result(NAME, {"quick": args.quick, "sizes": sizes}, {"sizes": results})
    print(f"\nwrote {path}")
    return {"sizes": results}


if __name__ == "__main__":
    main()
