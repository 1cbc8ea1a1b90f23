"""Garbage collection for a long-running controller process: full collections on a schedule.

The detection state of thousands of nodes is hundreds of thousands of long-lived objects.
CPython starts a full (generation 2) collection on its own whenever that population has
grown by a quarter, at any moment: measured at 3,000 nodes it stopped the event loop for
0.5 s every ~25 s while fail-slow windows filled, which is the whole p99 of report
latency. Here the young generations are collected as usual (a bigger gen-0 budget: fewer,
still short, collections), automatic full collections are pushed out of reach, and a
full collection runs on the sweep's schedule instead (every ``every_s``), so reference
cycles among old objects are still reclaimed, at a known time.
"""

from __future__ import annotations

import asyncio
import gc
import time

import structlog

log = structlog.get_logger(__name__)

GEN0_THRESHOLD = 50_000
GEN1_THRESHOLD = 50
GEN2_THRESHOLD = 1_000_000_000  # gen-1 collections before an automatic full one: never, in practice


def tune() -> None:
    """Freeze what start-up built (never scanned again) and move full collections to ``run``."""
    gc.freeze()
    gc.set_threshold(GEN0_THRESHOLD, GEN1_THRESHOLD, GEN2_THRESHOLD)


async def run(every_s: float = 600.0) -> None:
    """Full collection every ``every_s`` seconds, timed in the log."""
    while True:
        await asyncio.sleep(every_s)
        started = time.perf_counter()
        found = gc.collect()
        log.info("gc_full_collection", seconds=round(time.perf_counter() - started, 3), unreachable=found)
