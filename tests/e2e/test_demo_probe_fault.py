"""The demo with a fault only probes see (issue 29): real agents on simulated hardware, each
probing through the demo's drawn data plane (``DrawnProber``), the controller's probe mesh
planning, localising and opening the incident. A leaf that silently drops 3 % of what crosses
it shows on no counter and no port: the mesh names the leaf, the healer alerts and evicts no one.
"""

from __future__ import annotations

import asyncio
import re
import sqlite3
from pathlib import Path

import pytest

from starpulse.app.demo import _demo
from starpulse.app.demo_faults import ScriptedFault

pytestmark = [pytest.mark.slow, pytest.mark.timeout(200)]


async def test_a_silent_drop_on_a_leaf_is_injected_and_named_by_the_probe_mesh(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = [ScriptedFault("switch_silent_drop", node="node-001", index=3, after_s=0.0)]
    await asyncio.wait_for(_demo(4, 150.0, "127.0.0.1:0", "127.0.0.1:0", tmp_path, script=script), 180)
    out = capsys.readouterr().out
    injected = re.search(r"inject switch_silent_drop loss=0.03 on (leaf-\S+) \(no counter shows it", out)
    assert injected is not None, out[-3000:]
    leaf = injected.group(1)
    assert re.search(rf"healer: inc-\d+ switch fault at {leaf}.*: alert only", out), out[-4000:]
    assert "healer: evicted" not in out, out[-4000:]  # the fabric's fault takes no node out
    assert "1 fault only probes see" in out, out[-2000:]
    with sqlite3.connect(tmp_path / "controller.db") as db:
        found = db.execute("SELECT kind, root_cause FROM incidents ORDER BY seq").fetchall()
    assert found == [("switch_fault", leaf)], found
