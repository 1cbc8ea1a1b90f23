"""tools/clock_count.py finds what reads real time where a fake clock should (issue 26 item 7)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "clock_count.py"

TEST_SOURCE = """
import time
from starpulse.core.clock import FakeClock

def test_timed():
    t0 = time.monotonic()
    assert time.monotonic() - t0 < 5

def test_waits():
    deadline = time.monotonic() + 5
    while True:
        remaining = deadline - time.monotonic()
        assert remaining > 0
        assert time.monotonic() < deadline

def test_on_the_fake_clock():
    clock = FakeClock()
    assert clock.time() > 0
"""

CONTROLLER_SOURCE = """
from starpulse.core.clock import SYSTEM_CLOCK, Clock

class Falls:
    def __init__(self, clock: Clock | None = None) -> None: ...

class Defaults:
    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None: ...

class Picks:
    def __init__(self) -> None:
        self.clock = SYSTEM_CLOCK

class HandedOne:
    def __init__(self, clock: Clock) -> None: ...
"""


def test_counts_timing_asserts_guards_and_optional_clocks(tmp_path: Path) -> None:
    """One timing assert, two deadline guards, three optional clocks; the fake clock and a required one are fine."""
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(TEST_SOURCE)
    (tmp_path / "controller").mkdir()
    (tmp_path / "controller" / "part.py").write_text(CONTROLLER_SOURCE)
    out = subprocess.run(
        [sys.executable, str(TOOL), "--root", str(tmp_path), "--list"], check=True, capture_output=True, text=True
    ).stdout
    assert "wall-clock asserts in tests/: 1 timing, 2 deadline guards" in out
    assert "optional clocks in controller/: 3" in out
    assert "__init__(clock=None)" in out and "__init__(clock=SYSTEM_CLOCK)" in out
