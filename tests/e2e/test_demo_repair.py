"""The demo's repair story, short (CI): real agents on simulated hardware, the in-memory scheduler.

Two faults on a 4+1-node cluster; the demo stops once both were followed through and the
cluster settled. Each evicted node must come back (repaired by the simulated GPU reset or
reboot, validated by its agent's real burn-in subprocess) or be retired, never stay in
repair, and the spare pool must end at its target. The 10-minute unattended run is
bench/demo_repair.py (not run in CI).
"""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from starpulse.app.demo import _demo

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


async def test_two_faults_followed_through_to_a_settled_cluster(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    await asyncio.wait_for(_demo(4, 170.0, "127.0.0.1:0", "127.0.0.1:0", tmp_path, max_faults=2), 200)
    out = capsys.readouterr().out
    injected = re.findall(r"inject (\w+)", out)
    assert len(injected) == 2, out[-3000:]
    evicted = re.findall(r"healer: evicted (node-\d+)", out)
    assert evicted, out[-3000:]
    ended = re.findall(r"repair: (node-\d+) -> (spare|in_service|retired)", out)
    assert sorted(n for n, _ in ended) == sorted(evicted), out[-3000:]  # every evicted node came back or retired
    assert any(o in ("spare", "in_service") for _, o in ended)
    summary = out[out.index("demo over") :]
    assert re.search(r"spare pool: (\d+) available of target (\d+)", summary)
    available, target = map(int, re.search(r"spare pool: (\d+) available of target (\d+)", summary).groups())  # type: ignore[union-attr]
    assert available >= target, summary
    assert "repairing" not in summary and "validating" not in summary and "evicted" not in summary, summary
