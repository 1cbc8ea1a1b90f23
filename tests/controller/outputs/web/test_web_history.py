"""The node page's short time series: fixed-size rings, and their memory bound at 10,000 nodes."""

from __future__ import annotations

import asyncio
import math
import tracemalloc
from collections.abc import Callable

import pytest

from controller.ingest.registry import NodeRecord
from controller.outputs.web.history import DEFAULT_SIZE, METRICS, History, Ring, report_point
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb


def node(name: str, temp: float | None = 70.0, role: int = ipb.NODE_ROLE_COMPUTE) -> NodeRecord:
    gpu = tpb.GpuSample(index=0, power_w=500, utilization_gpu_pct=50)
    if temp is not None:
        gpu.temperature_c = temp
    rec = NodeRecord(node_id=name, role=role, state="online", first_seen_ms=0, last_seen_ms=0)
    rec.latest_report = tpb.Report(gpus=[gpu])
    return rec


def test_ring_keeps_the_last_size_points_oldest_first() -> None:
    ring = Ring(4)
    for t in range(1, 8):
        ring.append(t * 1000, (float(t), 0.0, 0.0, math.nan))
    body = ring.to_json()
    assert body["t_ms"] == [4000, 5000, 6000, 7000]
    assert body["series"]["temperature_c"] == [4.0, 5.0, 6.0, 7.0]
    assert body["series"]["ecc_dbe"] == [None] * 4  # never reported: null, not 0
    assert len(ring.t_ms) == 4 and all(len(c) == 4 for c in ring.values)


def test_report_point_takes_the_hottest_gpu_and_total_power() -> None:
    report = tpb.Report(
        gpus=[tpb.GpuSample(index=0, temperature_c=60, power_w=300), tpb.GpuSample(index=1, temperature_c=80)]
    )
    temp, power, util, dbe = report_point(report)
    assert (temp, power) == (80, 300) and math.isnan(util) and math.isnan(dbe)


def test_history_skips_switches_and_silent_nodes_and_forgets_departed_ones() -> None:
    history = History(size=3, step_s=15)
    silent = NodeRecord(node_id="node-9", role=ipb.NODE_ROLE_COMPUTE, state="online", first_seen_ms=0, last_seen_ms=0)
    nodes = [node("node-1"), node("leaf-1", role=ipb.NODE_ROLE_SWITCH), silent]
    assert history.sample(nodes, 1000) == 1
    assert set(history.rings) == {"node-1"}
    assert history.of("node-9")["t_ms"] == [] and history.of("node-9")["step_s"] == 15
    assert history.sample([], 2000) == 0 and history.rings == {}


def test_size_must_leave_room_for_a_line() -> None:
    with pytest.raises(ValueError, match="at least 2"):
        History(size=1)


def traced(fn: Callable[[], object]) -> int:
    """Bytes still allocated after ``fn`` (tracemalloc)."""
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        fn()
        return tracemalloc.get_traced_memory()[0] - base
    finally:
        tracemalloc.stop()


def test_memory_is_bounded_at_ten_thousand_nodes() -> None:
    """The docstring's bound: size * (8 + 4 * metrics) bytes per node plus under 1 KiB, at any age."""
    size, nodes = DEFAULT_SIZE, 10_000
    history = History()
    fleet = [node(f"node-{i:05d}") for i in range(nodes)]
    used = traced(lambda: history.sample(fleet, 0))  # every ring is allocated whole on first sight
    bound = nodes * (size * (8 + 4 * len(METRICS)) + 1024)
    assert used <= bound, f"{used / 1e6:.1f} MB for {nodes} nodes, bound {bound / 1e6:.1f} MB"
    assert used < 40e6


def test_a_full_history_costs_what_the_first_sample_did() -> None:
    """Past ``size`` samples the oldest points are overwritten: no growth with age."""
    history = History()
    fleet = [node(f"node-{i:04d}") for i in range(1000)]
    first = traced(lambda: history.sample(fleet, 0))

    def fill() -> None:
        for t in range(1, DEFAULT_SIZE + 30):
            history.sample(fleet, t * 15_000)

    grown = traced(fill)
    assert grown <= first * 0.05, (first, grown)
    assert all(r.count == DEFAULT_SIZE and len(r.t_ms) == DEFAULT_SIZE for r in history.rings.values())
    assert history.of("node-0001")["t_ms"][-1] == (DEFAULT_SIZE + 29) * 15_000


async def test_sampling_in_slices_yields_to_the_loop_and_matches_a_whole_sample() -> None:
    """The sampler the web app runs: same points as :meth:`History.sample`, the loop served between slices."""
    fleet = [node(f"node-{i:04d}", temp=float(i % 90)) for i in range(1200)]
    whole, sliced = History(size=4), History(size=4)
    whole.sample(fleet, 1000)
    ticks = 0

    async def other_work() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    other = asyncio.create_task(other_work())
    await asyncio.sleep(0)
    before = ticks
    assert await sliced.sample_in_slices(fleet, 1000, per_slice=500) == 1200
    other.cancel()
    assert ticks - before >= 2  # 1,200 nodes in slices of 500: the loop ran between them
    assert {n: r.to_json() for n, r in sliced.rings.items()} == {n: r.to_json() for n, r in whole.rings.items()}
