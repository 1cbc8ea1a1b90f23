"""Probe-mesh planning at fleet size: how long one replan takes and what it asks of each NIC.

The controller replans when the fleet or the fabric changes (at most every
``detection.probes.replan_min_s``); this times ``plan_mesh`` over a generated rail-optimised
fabric and the building of every node's pushed ``ProbePlan`` (median of ``--repeats``), and
reports targets, flows per target, packets per second per NIC and the largest plan message.

    .venv/bin/python -m bench.probe_plan [--nodes 2048] [--per-block 32] [--spines 8] [--repeats 3] [--shards 2]
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import quiet_logging, table, write_result
from controller.detect.probe_sums import ProbeSums
from controller.detect.probes import ProbeLocaliser, ProbeObs
from controller.fabric import generate_fabric
from controller.fabric.probeplan import ProbeConfig, plan_mesh
from starpulse.core.clock import FakeClock

NAME = "probe_plan"


def run(nodes: int, per_block: int, spines: int, repeats: int, shards: int = 2) -> dict[str, Any]:
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
    localisation = _localise(fabric, config, plan)
    localisation.update(_sharded(fabric, config, plan, shards))
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
        **localisation,
    }


def _localise(fabric: Any, config: ProbeConfig, plan: Any) -> dict[str, Any]:
    """Localisation over full windows: every target's summed result, as reports bring them.

    Times what lands on the controller's loop: adding each report's results (the running sums,
    expiry included), one localisation on a clean fabric, one with 1.5 % loss on one leaf (the
    vote runs), and working out ``health`` and its worst components when the topology view reads
    them (after each clean localisation, and after the lossy one).
    """
    clock = FakeClock()
    loc = ProbeLocaliser(fabric, config, clock=clock)
    leaf = sorted(fabric.leaves())[len(fabric.leaves()) // 2]
    through = {t.local_nic: fabric.leaf_of(t.local_nic) for ts in plan.targets.values() for t in ts}
    count = 0
    add_s: list[float] = []
    clean_s: list[float] = []
    lossy_s: list[float] = []
    blamed: list[str] = []
    view_clean_s: list[float] = []
    windows = int(config.localise_window_s // config.window_s)
    for w in range(3 * windows):
        lossy = w >= 2 * windows
        clock.advance(config.window_s)
        for node, targets in plan.targets.items():
            obs = []
            for t in targets:
                hit = lossy and leaf in (through[t.local_nic], through.get(t.peer_nic) or fabric.leaf_of(t.peer_nic))
                obs.append(ProbeObs(t.local_nic, t.peer_nic, "", 200, 3 if hit else 0, 12.0, 3.0, False))
            started = time.perf_counter()
            loc.add(node, obs)
            add_s.append(time.perf_counter() - started)
            count += len(obs)
        started = time.perf_counter()
        blames = loc.localise()
        (lossy_s if lossy else clean_s).append(time.perf_counter() - started)
        blamed = [b.component for b in blames]
        if not lossy and w >= windows:
            started = time.perf_counter()
            _view(loc)
            view_clean_s.append(time.perf_counter() - started)
    started = time.perf_counter()
    health, worst = _view(loc)
    health_s = time.perf_counter() - started
    return {
        "localise_observations_per_window": count // (3 * windows) * windows,
        "localise_add_per_report_ms_median": round(1000 * statistics.median(add_s), 3),
        "localise_add_per_window_s": round(sum(add_s) / (3 * windows), 3),
        "localise_clean_s_max": round(max(clean_s[windows:]), 4),
        "localise_lossy_leaf_s_max": round(max(lossy_s), 4),
        "localise_lossy_leaf_blamed": ",".join(blamed) or "-",
        "localise_lossy_leaf_expected": leaf,
        "health_on_read_s": round(health_s, 3),
        "health_on_read_clean_s_median": round(statistics.median(view_clean_s), 3),
        "health_components": len(health),
        "health_worst_after_lossy_leaf": worst[0]["component"] if worst else "-",
    }


def _sharded(fabric: Any, config: ProbeConfig, plan: Any, shards: int) -> dict[str, Any]:
    """The same full window held by ``shards`` detection shards (each its nodes' results, by the
    shards' hash), with 1.5 % loss on one leaf: what one localisation costs each side. The shard's
    side: its snapshot and, when the vote's first round has a suspect, the keys through the
    components that can be blamed, each pickled as the shard sends it; the controller's side:
    unpickling and merging the snapshots, the vote (both off its event loop, in a worker thread),
    and the topology view's read of the merged sums."""
    import pickle
    import zlib

    clock = FakeClock()
    loc = ProbeLocaliser(fabric, config, clock=clock, local=False)
    holders = [ProbeSums(fabric, config) for _ in range(shards)]
    leaf = sorted(fabric.leaves())[len(fabric.leaves()) // 2]
    through = {t.local_nic: fabric.leaf_of(t.local_nic) for ts in plan.targets.values() for t in ts}
    windows = int(config.localise_window_s // config.window_s)
    for _ in range(windows):
        clock.advance(config.window_s)
        for node, targets in plan.targets.items():
            obs = [
                ProbeObs(
                    t.local_nic,
                    t.peer_nic,
                    "",
                    200,
                    3 if leaf in (through[t.local_nic], through.get(t.peer_nic) or fabric.leaf_of(t.peer_nic)) else 0,
                    12.0,
                    3.0,
                    False,
                )
                for t in targets
            ]
            holders[zlib.crc32(node.encode()) % shards].add(clock.time_ms(), obs)
    req = loc.request()
    started = time.perf_counter()
    blobs = [pickle.dumps(h.snapshot(req), pickle.HIGHEST_PROTOCOL) for h in holders]
    snapshot_s = (time.perf_counter() - started) / shards
    started = time.perf_counter()
    question = loc.merge([pickle.loads(b) for b in blobs])
    needs = question.comps if question is not None else frozenset()
    merge_s = time.perf_counter() - started
    started = time.perf_counter()
    parts = [pickle.dumps(h.keys_through(needs), pickle.HIGHEST_PROTOCOL) for h in holders] if needs else []
    keys_s = (time.perf_counter() - started) / shards
    records = [r for part in parts for r in pickle.loads(part)]
    started = time.perf_counter()
    blames = loc.conclude(records, [])
    vote_s = time.perf_counter() - started
    started = time.perf_counter()  # again: the controller's paths of the asked keys are known now
    loc.merge([pickle.loads(b) for b in blobs])
    loc.conclude(records, [])
    vote_warm_s = time.perf_counter() - started
    started = time.perf_counter()
    _view(loc)
    view_s = time.perf_counter() - started
    return {
        "sharded_holders": shards,
        "sharded_snapshot_per_shard_s": round(snapshot_s, 3),
        "sharded_snapshot_bytes_per_shard": sum(len(b) for b in blobs) // shards,
        "sharded_merge_s": round(merge_s, 3),
        "sharded_keys_asked_components": len(needs),
        "sharded_keys_per_shard_s": round(keys_s, 3),
        "sharded_keys_bytes_per_shard": sum(len(p) for p in parts) // max(1, len(parts)),
        "sharded_vote_s": round(vote_s, 3),
        "sharded_merge_and_vote_again_s": round(vote_warm_s, 3),
        "sharded_lossy_leaf_blamed": ",".join(b.component for b in blames) or "-",
        "sharded_view_s": round(view_s, 3),
    }


def _view(loc: ProbeLocaliser) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """What the topology view reads (controller.query.live): the probe health it colours the
    cables with and the worst links, worked out once per localisation (the fabric's own
    components' share where the localiser has one; before issue 29's fix, every component's)."""
    health = getattr(loc, "fabric_health", None)
    return (health if health is not None else loc.health), loc.worst()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=2048)
    ap.add_argument("--per-block", type=int, default=32)
    ap.add_argument("--spines", type=int, default=8)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shards", type=int, default=2, help="detection shards holding the window (the sharded figures)")
    args = ap.parse_args(argv)
    quiet_logging()
    if args.shards < 1:
        raise SystemExit("--shards must be at least 1")
    figures = run(args.nodes, args.per_block, args.spines, args.repeats, args.shards)
    print(table("probe mesh planning", list(figures.items())))
    params = {
        "nodes": args.nodes,
        "per_block": args.per_block,
        "spines": args.spines,
        "repeats": args.repeats,
        "shards": args.shards,
    }
    print(f"wrote {write_result(NAME, params, figures)}")
    return figures


if __name__ == "__main__":
    main()
