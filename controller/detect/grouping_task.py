"""Grouping at the moment a window closes, not on the next detection tick.

The correlator knows when its first pending condition's grouping window closes
(``next_due_ms``); this task sleeps until then on the injected clock, is woken whenever
a new condition starts waiting (its window may close sooner), and groups. The periodic
detection tick still groups too (and expires conditions); running both is harmless,
since grouping takes only what is due.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import structlog

from starpulse.core.clock import Clock

log = structlog.get_logger(__name__)


class GroupingTask:
    """Runs ``group`` whenever ``due_ms`` has passed; ``wake`` when something new is pending."""

    def __init__(
        self, due_ms: Callable[[], int | None], group: Callable[[], object], clock: Clock, retry_s: float = 1.0
    ) -> None:
        self._due_ms = due_ms
        self._group = group
        self._clock = clock
        self._retry_s = retry_s
        self._wake = asyncio.Event()
        self.groupings = 0

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        while True:
            self._wake.clear()
            due = self._due_ms()
            delay = None if due is None else (due - self._clock.time_ms()) / 1000
            if delay is None or delay > 0:
                await self._wait(delay)
                continue  # woken or due: look again
            try:
                self._group()
                self.groupings += 1
            except Exception:
                log.exception("grouping_failed")
                await self._wait(self._retry_s)  # what stays due is tried again, not in a spin

    async def _wait(self, seconds: float | None) -> None:
        """Until woken, or ``seconds`` on the clock (None: only woken)."""
        waiter = asyncio.ensure_future(self._wake.wait())
        if seconds is None:
            try:
                await waiter
            finally:
                waiter.cancel()
            return
        timer = asyncio.ensure_future(self._clock.sleep(seconds))
        try:
            await asyncio.wait({waiter, timer}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            timer.cancel()
