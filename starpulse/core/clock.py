"""Time from one place: the code that decides reads the clock it was handed.

Correlation's settle and resolve hold, the guards' cool-downs and breaker window, the
notifier's retry backoff, presence timeouts: all of them are decisions about time. When
every read of the time and every wait goes through one injected ``Clock``, a test or a
fleet simulator can hand the real decision code a ``FakeClock`` and drive hours of it in
milliseconds, with no real time passing and no sleeping.

Two things stay on real time on purpose: durations measured for metrics
(``time.perf_counter``: how long the CPU took is real whatever the simulated hour) and
the bounds on real I/O (gRPC and HTTP timeouts, subprocess waits), which limit what a
real peer does.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import time
from typing import Any, Protocol, TypeVar

T = TypeVar("T")

_NS = 1_000_000_000
_NS_PER_MS = 1_000_000


class Clock(Protocol):
    """What the controller's parts read the time from and wait on."""

    def time(self) -> float:
        """Wall-clock seconds since the epoch: what is stored and what people read."""
        ...

    def time_ms(self) -> int:
        """``time()`` in whole milliseconds, the unit stored timestamps are kept in."""
        ...

    def monotonic(self) -> float:
        """Seconds from an arbitrary origin that never go back: intervals and deadlines."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Return once ``seconds`` have passed on this clock's monotonic time."""
        ...

    async def wait_for(self, future: asyncio.Future[T], timeout_s: float) -> T:
        """``future``'s result, or TimeoutError once ``timeout_s`` passed on this clock.

        The future is left as it is on a timeout (a late answer still lands in it).
        """
        ...


class SystemClock:
    """The real clock: ``time.time``, ``time.monotonic`` and ``asyncio.sleep``."""

    __slots__ = ()

    def time(self) -> float:
        return time.time()

    def time_ms(self) -> int:
        return int(time.time() * 1000)

    def monotonic(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    async def wait_for(self, future: asyncio.Future[T], timeout_s: float) -> T:
        return await asyncio.wait_for(asyncio.shield(future), timeout_s)

    def __repr__(self) -> str:
        return "SystemClock()"


SYSTEM_CLOCK = SystemClock()
"""The one real clock, handed in by whoever composes real parts (it holds no state)."""


class FakeClock:
    """A clock that moves only when told to, for tests and simulations.

    Time is kept in integer nanoseconds, so advancing by 0.1 s ten times is exactly one
    second and ``time_ms`` never rounds down a step. ``advance`` moves wall and monotonic
    time together and wakes every ``sleep`` whose deadline it reached or passed; the woken
    tasks run at the event loop's next turn. ``run_for`` walks through the deadlines in
    order and yields at each one, so a loop that sleeps a second at a time turns once per
    simulated second. Use it from one thread: the one running the event loop, if any.
    """

    def __init__(self, start_ms: int = 1_700_000_000_000, monotonic_s: float = 1_000.0) -> None:
        """``start_ms``: wall time to begin at, in ms as stored (default 2023-11-14); ``monotonic_s``: any origin."""
        self._wall_ns = start_ms * _NS_PER_MS
        self._mono_ns = round(monotonic_s * _NS)
        self._sleepers: list[tuple[int, int, asyncio.Future[None]]] = []  # (deadline ns, seq, future)
        self._seq = itertools.count()

    def time(self) -> float:
        return self._wall_ns / _NS

    def time_ms(self) -> int:
        return self._wall_ns // _NS_PER_MS

    def monotonic(self) -> float:
        return self._mono_ns / _NS

    async def sleep(self, seconds: float) -> None:
        """Wait until the clock is advanced ``seconds`` past now; 0 or less only yields once."""
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._mono_ns + round(seconds * _NS), next(self._seq), future))
        await future  # cancelled: the future is done and is dropped when its deadline comes

    async def wait_for(self, future: asyncio.Future[T], timeout_s: float) -> T:
        """Wait for ``future`` until the clock is advanced ``timeout_s``: no real time is waited."""
        timer: asyncio.Future[None] = asyncio.ensure_future(self.sleep(timeout_s))
        either: set[asyncio.Future[Any]] = {future, timer}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            timer.cancel()
        if future.done():
            return future.result()
        raise TimeoutError(f"no answer within {timeout_s} s on the fake clock")

    @property
    def sleepers(self) -> int:
        """Sleeps still waiting for their deadline."""
        return sum(1 for _, _, f in self._sleepers if not f.done())

    def next_deadline(self) -> float | None:
        """The monotonic time the earliest waiting sleep ends at, or None when none waits."""
        self._drop_done()
        return self._sleepers[0][0] / _NS if self._sleepers else None

    def advance(self, seconds: float) -> None:
        """Move wall and monotonic time forward; wake the sleeps that are due."""
        if seconds < 0:
            raise ValueError(f"a clock does not go back: advance({seconds})")
        self._advance_ns(round(seconds * _NS))

    def set_ms(self, wall_ms: int) -> None:
        """Put the wall clock at ``wall_ms``.

        Forward it is ``advance`` (monotonic time moves too, sleeps wake); backward it is a
        wall-clock step such as NTP makes: monotonic time stays where it is.
        """
        target = wall_ms * _NS_PER_MS
        if target >= self._wall_ns:
            self._advance_ns(target - self._wall_ns)
        else:
            self._wall_ns = target

    async def run_for(self, seconds: float, turns: int = 5) -> None:
        """Let ``seconds`` pass deadline by deadline, giving tasks ``turns`` loop turns at each.

        Tasks get their turns first too, so one just created reaches its first sleep before
        time moves. A woken task runs until its next await; ``turns`` covers a few awaits on
        other in-process work (a queue, an event) before it sleeps again.
        """
        if seconds < 0:
            raise ValueError(f"a clock does not go back: run_for({seconds})")
        end = self._mono_ns + round(seconds * _NS)
        for _ in range(turns):
            await asyncio.sleep(0)
        while True:
            self._drop_done()
            if not self._sleepers or self._sleepers[0][0] > end:
                break
            self._advance_ns(max(0, self._sleepers[0][0] - self._mono_ns))
            for _ in range(turns):
                await asyncio.sleep(0)
        self._advance_ns(end - self._mono_ns)
        for _ in range(turns):
            await asyncio.sleep(0)

    def _advance_ns(self, step: int) -> None:
        self._wall_ns += step
        self._mono_ns += step
        self._wake()

    def _wake(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._mono_ns:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)

    def _drop_done(self) -> None:
        while self._sleepers and self._sleepers[0][2].done():
            heapq.heappop(self._sleepers)

    def __repr__(self) -> str:
        return f"FakeClock(time_ms={self.time_ms()}, monotonic={self.monotonic():.3f}, sleepers={self.sleepers})"
