"""The condition engine alone: CPU per full report of a healthy 8-GPU, 8-NIC node.

``bench.report_path`` measures everything a report costs the controller outside gRPC; this
isolates ``ConditionEngine.on_report`` (default rules, no fabric, a fake clock 10 s apart
per pass, ``tick`` between passes), so a change to the engine's own path shows without the
registry, the store or histograms around it. Process time per pass of all nodes; the
median and the best pass after ``--warmup`` passes. Run it interleaved with the tree to
compare against (``PYTHONPATH`` picks the tree).

    .venv/bin/python -m bench.condition_engine [--nodes 500] [--passes 25] [--warmup 3]
"""

from __future__ import annotations

import argparse
import statistics
import time

from controller.detect.conditions import ConditionEngine
from controller.detect.rules import load_rules
from controller.ingest.registry import NodeRecord
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

GPUS, NICS, LINKS = 8, 8, 2


def _node(node_id: str) -> NodeRecord:
    inv = ipb.Inventory()
    for i in range(GPUS):
        inv.gpus.add(index=i, uuid=f"GPU-{i}", pci_bus_id=f"00000000:{0x17 + i:02X}:00.0", nvlink_count=LINKS)
    for i in range(NICS):
        inv.nics.add(rdma_device=f"mlx5_{i}", port=1, netdev=f"ibp{i}", rate_gbps=400, paired_gpu_index=i)
    return NodeRecord(
        node_id=node_id, role=ipb.NODE_ROLE_COMPUTE, state="online", first_seen_ms=0, last_seen_ms=0, inventory=inv
    )


def _report(ts: int) -> tpb.Report:
    r = tpb.Report(seq=1, timestamp_ms=ts)
    r.collectors.add(name="gpu", supported=True, ok=True)
    for i in range(GPUS):
        g = r.gpus.add(index=i, uuid=f"GPU-{i}", temperature_c=60, clock_event_reasons=0x1 | 0x4)
        for link in range(LINKS):
            g.nvlinks.add(link=link, up=True, replay_errors=0, recovery_errors=0, crc_flit_errors=0)
    for i in range(NICS):
        n = r.nics.add(
            rdma_device=f"mlx5_{i}",
            port=1,
            netdev=f"ibp{i}",
            state_code=4,
            state="ACTIVE",
            phys_state_code=5,
            phys_state="LinkUp",
            rate_gbps=400,
        )
        n.counters["symbol_error"] = 0
        n.counters["port_rcv_errors"] = 0
    r.host.memory_total_bytes = 1000
    r.host.memory_available_bytes = 500
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=500)
    ap.add_argument("--passes", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=3)
    args = ap.parse_args()
    clock = FakeClock(1_000_000)
    engine = ConditionEngine(load_rules(), clock=clock)
    nodes = [_node(f"node-{i:05d}") for i in range(args.nodes)]
    per_report: list[float] = []
    for _ in range(args.passes):
        reports = [_report(clock.time_ms()) for _ in nodes]
        t0 = time.process_time()
        for node, report in zip(nodes, reports, strict=True):
            engine.on_report(node, report)
        per_report.append((time.process_time() - t0) / len(nodes) * 1e6)
        clock.advance(10)
        engine.tick()
    kept = per_report[args.warmup :]
    print(f"on_report us per report: median {statistics.median(kept):.1f}, best {min(kept):.1f} ({len(kept)} passes)")
    print(f"active conditions: {len(engine.active())}")


if __name__ == "__main__":
    main()
