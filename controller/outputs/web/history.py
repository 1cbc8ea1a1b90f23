"""Short time series for the node page, from the controller's own recent reports (no TSDB).

Every ``step_s`` the sampler reads each node's latest report and appends one point per
metric to that node's fixed-size ring: the last ``size`` samples of

- ``temperature_c``: the hottest GPU, °C
- ``power_w``: all GPUs together, W
- ``utilization_pct``: the mean GPU utilisation, %
- ``ecc_dbe``: volatile double-bit ECC errors, all GPUs together

Memory bound: a ring is one ``array('d')`` of timestamps and one ``array('f')`` per metric,
preallocated, so a node costs ``size * (8 + 4 * len(METRICS))`` bytes of samples plus a fixed
overhead of under 1 KiB (the arrays' headers and the dict entry): with the defaults (120
samples, 4 metrics) that is 2,880 bytes + overhead, under 40 MB at 10,000 nodes
(``tests/controller/outputs/web/test_web_history.py`` measures it). Prometheus and Grafana remain the
long-term store; this is the last ``size * step_s`` (30 minutes by default) at a glance.
A node that leaves the registry leaves the history on the next sample.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from array import array
from collections.abc import Callable, Iterable
from typing import Any

import structlog

from controller.ingest.registry import NodeRecord
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

METRICS = ("temperature_c", "power_w", "utilization_pct", "ecc_dbe")
DEFAULT_SIZE = 120
DEFAULT_STEP_S = 15.0
SLICE = 500  # nodes sampled between two yields to the event loop
NAN = math.nan


def report_point(report: tpb.Report) -> tuple[float, ...]:
    """One point per metric from a report; NaN where no GPU reported the field."""
    temps = [g.temperature_c for g in report.gpus if g.HasField("temperature_c")]
    power = [g.power_w for g in report.gpus if g.HasField("power_w")]
    util = [g.utilization_gpu_pct for g in report.gpus if g.HasField("utilization_gpu_pct")]
    dbe = [g.ecc_dbe_volatile for g in report.gpus if g.HasField("ecc_dbe_volatile")]
    return (
        max(temps) if temps else NAN,
        sum(power) if power else NAN,
        sum(util) / len(util) if util else NAN,
        float(sum(dbe)) if dbe else NAN,
    )


class Ring:
    """The last ``size`` points of one node, oldest overwritten first."""

    __slots__ = ("count", "head", "size", "t_ms", "values")

    def __init__(self, size: int) -> None:
        self.size = size
        self.head = 0  # where the next point goes
        self.count = 0
        self.t_ms = array("d", bytes(8 * size))
        self.values = [array("f", bytes(4 * size)) for _ in METRICS]

    def append(self, t_ms: int, point: tuple[float, ...]) -> None:
        self.t_ms[self.head] = t_ms
        for column, value in zip(self.values, point, strict=True):
            column[self.head] = value
        self.head = (self.head + 1) % self.size
        self.count = min(self.count + 1, self.size)

    def _order(self) -> list[int]:
        start = (self.head - self.count) % self.size
        return [(start + i) % self.size for i in range(self.count)]

    def to_json(self) -> dict[str, Any]:
        """Oldest first; a missing reading is null."""
        order = self._order()
        series = {
            name: [None if math.isnan(column[i]) else round(column[i], 2) for i in order]
            for name, column in zip(METRICS, self.values, strict=True)
        }
        return {"t_ms": [int(self.t_ms[i]) for i in order], "series": series}


class History:
    """Per-node rings, filled by :meth:`sample`; bounded by ``size`` per node (see the module doc)."""

    def __init__(self, size: int = DEFAULT_SIZE, step_s: float = DEFAULT_STEP_S) -> None:
        if size < 2:
            raise ValueError(f"history size must be at least 2 (got {size})")
        self.size = size
        self.step_s = step_s
        self.rings: dict[str, Ring] = {}

    def _take(self, rec: NodeRecord, now_ms: int) -> bool:
        if rec.role == ipb.NODE_ROLE_SWITCH or rec.latest_report is None:
            return False
        ring = self.rings.get(rec.node_id)
        if ring is None:
            ring = self.rings[rec.node_id] = Ring(self.size)
        ring.append(now_ms, report_point(rec.latest_report))
        return True

    def _forget_all_but(self, seen: set[str]) -> None:
        for gone in set(self.rings) - seen:
            del self.rings[gone]

    def sample(self, nodes: Iterable[NodeRecord], now_ms: int) -> int:
        """One point for every compute node with a report; returns how many were taken."""
        seen = {rec.node_id for rec in nodes if self._take(rec, now_ms)}
        self._forget_all_but(seen)
        return len(seen)

    async def sample_in_slices(self, nodes: Iterable[NodeRecord], now_ms: int, per_slice: int = SLICE) -> int:
        """:meth:`sample`, yielding to the event loop every ``per_slice`` nodes.

        At 10,000 nodes of 8 GPUs a whole sample takes a few hundred milliseconds of CPU; in
        slices the loop keeps serving agents and pages in between.
        """
        seen: set[str] = set()
        for i, rec in enumerate(nodes, 1):
            if self._take(rec, now_ms):
                seen.add(rec.node_id)
            if i % per_slice == 0:
                await asyncio.sleep(0)
        self._forget_all_but(seen)
        return len(seen)

    def of(self, node: str) -> dict[str, Any]:
        ring = self.rings.get(node)
        body = ring.to_json() if ring is not None else {"t_ms": [], "series": {m: [] for m in METRICS}}
        return {"node": node, "step_s": self.step_s, "size": self.size, **body}

    async def run(self, nodes: Callable[[], Iterable[NodeRecord]], now_ms: Callable[[], int]) -> None:
        """Sample every ``step_s`` until cancelled; a failing sample is logged, never fatal."""
        while True:
            try:
                await self.sample_in_slices(nodes(), now_ms())
            except Exception:
                log.exception("history_sample_failed")
            await asyncio.sleep(self.step_s)


class Sampler:
    """Start/stop :meth:`History.run` with the web app."""

    def __init__(self, history: History) -> None:
        self.history = history
        self._task: asyncio.Task[None] | None = None

    def start(self, nodes: Callable[[], Iterable[NodeRecord]], now_ms: Callable[[], int]) -> None:
        self._task = asyncio.create_task(self.history.run(nodes, now_ms))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
