"""Every line an agent logs names its node: a fleet's log store mixes thousands of agents."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any


def test_every_agent_log_line_carries_the_node(tmp_path: Path) -> None:
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "starpulse.app.cli", "agent", "--controller", "127.0.0.1:1",
            "--node-id", "node-042", "--backend", "sim", "--state-dir", str(tmp_path / "state"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    lines: list[dict[str, Any]] = []
    # the collectors probed and started, the link retrying the absent controller
    wanted = {"collector_probe", "agent_started", "client_reconnect_wait"}
    # Read until all of that was logged, however long a loaded machine takes to get there (a
    # fixed 4 s was a guess), then stop the agent.
    while len(lines) < 5 or not {line["event"] for line in lines} >= wanted:
        text = proc.stdout.readline()
        if not text:  # the agent ended on its own: what it said is below
            break
        if text.startswith("{"):
            lines.append(json.loads(text))
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    lines += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(lines) >= 5, (lines, out, err)
    assert {line["event"] for line in lines} >= wanted
    assert all(line.get("node") == "node-042" for line in lines), [ln for ln in lines if ln.get("node") != "node-042"]
