"""The demo as a new user first sees it: the dashboard address first, one readable stream, a log file named."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from starpulse.app.demo import _demo, counted
from starpulse.core.logs import configure_logging

STRUCTLOG_LINE = re.compile(r"^\s*\{.*\}\s*$|\[(debug|info|warning|error)\s*\]|\bevent=|\blevel=")


def structured_lines(text: str) -> list[str]:
    """Lines that are structlog's (JSON objects or its console form), not the demo's own words."""
    return [line for line in text.splitlines() if STRUCTLOG_LINE.search(line)]


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
    assert structured_lines(out.stdout) == []


def test_in_process_demo_keeps_logs_off_stdout_whatever_the_caller_set_up(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """bench.demo_repair sets warnings-to-stdout logging and calls the demo in-process: the
    controller's start warnings (grpc_plaintext, admin_open) and incident logs went to its screen."""
    saved = structlog.get_config()
    configure_logging("warning", fmt="json", stream=sys.stdout)  # what bench.common.quiet_logging does
    try:
        asyncio.run(_demo(2, 3.0, "127.0.0.1:0", "127.0.0.1:0", tmp_path))
        assert structlog.get_config()["logger_factory"]._file is sys.stdout  # the caller's logging, restored
    finally:
        structlog.configure(**saved)  # not this test's captured stdout for the tests after it
        logging.basicConfig(force=True)
    out = capsys.readouterr().out
    assert out.startswith("dashboard: http://127.0.0.1:")
    assert structured_lines(out) == [], structured_lines(out)[:5]
    logged = [json.loads(line)["event"] for line in (tmp_path / "demo.log").read_text().splitlines()]
    assert {"controller_started", "grpc_plaintext", "admin_open"} <= set(logged)
    assert f"logs:     {tmp_path / 'demo.log'}" in out


def test_counts_read_as_words() -> None:
    assert (counted(1, "event"), counted(0, "event"), counted(3, "restart")) == ("1 event", "0 events", "3 restarts")


def test_scenario_text_verdict_names_evictions_and_resumes(capsys: pytest.CaptureFixture[str]) -> None:
    """The text verdict said which faults were found but not what healing did; now it says both."""
    from starpulse.app.cli.simulate import _print_verdict

    verdict = {
        "scenario": "heal-gpu",
        "duration_s": 30.0,
        "faults": [],
        "incidents": [],
        "evictions": [
            {"node": "node-001", "at_s": 7.25, "replacement": "node-009", "incident": "inc-000001", "dry_run": False}
        ],
        "jobs": [{"name": "train", "restarts": 1, "steps_lost": 40, "downtime_s": 12.5, "resumed_from_step": 1200}],
        "breaker_open": False,
        "expectations": {"checked": False, "passed": True, "failures": []},
    }
    _print_verdict(verdict)
    out = capsys.readouterr().out.splitlines()
    assert "  evicted node-001 at 7.2 s for inc-000001, node-009 stands in" in out
    assert "  job train: 1 restart, 40 steps lost, 12.5 s down, resumed from step 1200" in out
    assert not any("breaker" in line for line in out)
