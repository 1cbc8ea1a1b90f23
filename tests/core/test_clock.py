"""The one clock: the real one reads the system, the fake one moves only when told to."""

from __future__ import annotations

import asyncio
import time

import pytest

from starpulse.core.clock import SYSTEM_CLOCK, Clock, FakeClock, SystemClock


class TestSystemClock:
    def test_reads_the_system_clocks(self) -> None:
        clock: Clock = SystemClock()
        before_ms, before_mono = int(time.time() * 1000), time.monotonic()
        ms, wall, mono = clock.time_ms(), clock.time(), clock.monotonic()
        after_ms, after_mono = int(time.time() * 1000), time.monotonic()
        assert before_ms <= ms <= after_ms and before_ms / 1000 - 1 <= wall <= after_ms / 1000 + 1
        assert before_mono <= mono <= after_mono

    async def test_sleep_waits_real_time(self) -> None:
        started = time.monotonic()
        await SYSTEM_CLOCK.sleep(0.05)
        assert time.monotonic() - started >= 0.045


class TestFakeClock:
    def test_starts_where_told_and_stands_still(self) -> None:
        clock = FakeClock(1_000_000, monotonic_s=50.0)
        assert (clock.time_ms(), clock.time(), clock.monotonic()) == (1_000_000, 1_000.0, 50.0)
        time.sleep(0.01)  # real time passing moves nothing
        assert (clock.time_ms(), clock.monotonic()) == (1_000_000, 50.0)

    def test_advance_moves_wall_and_monotonic_time_exactly(self) -> None:
        clock = FakeClock(1_000_000, monotonic_s=0.0)
        for _ in range(10):
            clock.advance(0.1)
        assert clock.time_ms() == 1_001_000 and clock.monotonic() == 1.0
        clock.advance(0.0005)
        clock.advance(0.0005)
        assert clock.time_ms() == 1_001_001  # sub-millisecond steps add up, none is rounded away

    def test_time_does_not_go_back(self) -> None:
        clock = FakeClock()
        with pytest.raises(ValueError, match="does not go back"):
            clock.advance(-1)

    def test_set_ms_forward_is_advance_backward_is_a_wall_clock_step(self) -> None:
        clock = FakeClock(1_000_000, monotonic_s=10.0)
        clock.set_ms(1_005_000)
        assert (clock.time_ms(), clock.monotonic()) == (1_005_000, 15.0)
        clock.set_ms(900_000)  # NTP stepped the wall clock back: intervals must not see it
        assert (clock.time_ms(), clock.monotonic()) == (900_000, 15.0)

    async def test_sleep_returns_only_once_advanced_past_its_deadline(self) -> None:
        clock = FakeClock()
        sleeper = asyncio.create_task(clock.sleep(30))
        await asyncio.sleep(0)
        assert clock.sleepers == 1 and clock.next_deadline() == clock.monotonic() + 30
        clock.advance(29.999)
        await asyncio.sleep(0)
        assert not sleeper.done()
        clock.advance(0.001)
        await asyncio.sleep(0)
        assert sleeper.done() and clock.sleepers == 0 and clock.next_deadline() is None

    async def test_sleep_of_zero_only_yields(self) -> None:
        clock = FakeClock()
        await asyncio.wait_for(clock.sleep(0), 1.0)
        await asyncio.wait_for(clock.sleep(-5), 1.0)
        assert clock.sleepers == 0

    async def test_a_cancelled_sleep_is_forgotten(self) -> None:
        clock = FakeClock()
        sleeper = asyncio.create_task(clock.sleep(10))
        await asyncio.sleep(0)
        sleeper.cancel()
        with pytest.raises(asyncio.CancelledError):
            await sleeper
        assert clock.sleepers == 0 and clock.next_deadline() is None
        clock.advance(20)  # waking a cancelled sleep is a no-op

    async def test_sleepers_wake_in_deadline_order(self) -> None:
        clock = FakeClock()
        woke: list[int] = []

        async def nap(seconds: int) -> None:
            await clock.sleep(seconds)
            woke.append(seconds)

        tasks = [asyncio.create_task(nap(s)) for s in (3, 1, 2)]
        await asyncio.sleep(0)
        await clock.run_for(3)
        await asyncio.gather(*tasks)
        assert woke == [1, 2, 3]

    async def test_run_for_lets_a_new_task_reach_its_first_sleep_before_time_moves(self) -> None:
        clock = FakeClock(monotonic_s=0.0)
        woke: list[float] = []

        async def nap() -> None:
            await clock.sleep(5)
            woke.append(clock.monotonic())

        task = asyncio.create_task(nap())  # not started yet: run_for must not jump past its deadline
        await clock.run_for(10)
        assert task.done() and woke == [5.0] and clock.monotonic() == 10.0

    async def test_run_for_turns_a_periodic_loop_once_per_period_without_real_time(self) -> None:
        """An hour of a once-a-second loop, with the loop's own view of the time at each turn."""
        clock = FakeClock(1_000_000, monotonic_s=0.0)
        seen: list[float] = []

        async def loop() -> None:
            while True:
                await clock.sleep(1.0)
                seen.append(clock.monotonic())

        task = asyncio.create_task(loop())
        await asyncio.sleep(0)
        started = time.monotonic()
        await clock.run_for(3600)
        real_s = time.monotonic() - started
        task.cancel()
        assert seen == [float(s) for s in range(1, 3601)]
        assert clock.time_ms() == 1_000_000 + 3_600_000
        assert real_s < 30  # nothing slept for real (an hour took well under a minute of CPU)

    def test_repr_says_where_it_stands(self) -> None:
        assert repr(FakeClock(5_000, monotonic_s=2.0)) == "FakeClock(time_ms=5000, monotonic=2.000, sleepers=0)"
