"""The demo as a new user first sees it: the dashboard address first, one readable stream, a log file named."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

from starpulse.app.demo import counted


def test_first_line_is_the_dashboard_and_the_logs_go_to_a_named_file() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", "demo", "--nodes", "2", "--duration", "3", "--http", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    assert re.fullmatch(r"dashboard: http://127\.0\.0\.1:\d+/", lines[0]), lines[:3]
    logs = re.fullmatch(r"  logs: +(\S+) \(the controller's and the agents' JSON lines\)", lines[1])
    assert logs, lines[:3]
    path = Path(logs.group(1))
    try:
        logged = [json.loads(line) for line in path.read_text().splitlines()]
        assert any(e["event"] == "controller_started" for e in logged)  # the structured logs are there ...
        assert "controller_started" not in out.stdout + out.stderr  # ... and not mixed into the story
        assert "grpc_plaintext" not in out.stdout + out.stderr
    finally:
        path.unlink()
    assert "starting 2 simulated nodes + 1 hot spare" in out.stdout


def test_counts_read_as_words() -> None:
    assert (counted(1, "event"), counted(0, "event"), counted(3, "restart")) == ("1 event", "0 events", "3 restarts")
