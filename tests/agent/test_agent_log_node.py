"""Every line an agent logs names its node: a fleet's log store mixes thousands of agents."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path


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
    time.sleep(4)  # collectors probed and started, the link retrying the absent controller
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    lines = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(lines) >= 5, (out, err)
    assert {line["event"] for line in lines} >= {"collector_probe", "agent_started"}
    assert all(line.get("node") == "node-042" for line in lines), [ln for ln in lines if ln.get("node") != "node-042"]
