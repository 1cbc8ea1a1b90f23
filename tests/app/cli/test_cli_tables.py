"""The CLI's tables (rich): colour on a terminal or with FORCE_COLOR, none when piped or with NO_COLOR.

The real ``starpulse incidents`` against a real controller, once piped, once on a pty.
"""

from __future__ import annotations

import asyncio
import os
import pty
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from controller.detect.model import Incident
from controller.service import Controller, ControllerConfig
from starpulse.app.cli.tables import Col, colour_wanted, render
from starpulse.core.clock import SYSTEM_CLOCK
from tests.helpers import free_port

ESC = "\x1b["
COLS = [Col("INCIDENT"), Col("STATE", styled=True), Col("SEVERITY", "right", styled=True), Col("ROOT CAUSE")]
ROWS = [["inc-000001", "open", "critical", "node-000/gpu-3"], ["inc-000002", "resolved", "warning", "(network)"]]


def test_plain_rendering_keeps_headers_columns_and_no_trailing_blanks() -> None:
    lines = render(COLS, ROWS, colour=False).splitlines()
    assert lines[0].split() == ["INCIDENT", "STATE", "SEVERITY", "ROOT", "CAUSE"]
    assert lines[1].split() == ROWS[0] and lines[2].split() == ROWS[1]
    assert all(line == line.rstrip() for line in lines) and ESC not in "".join(lines)
    assert lines[1].index("critical") + len("critical") == lines[2].index("warning") + len("warning")  # right-aligned


def test_a_long_row_is_never_wrapped_when_piped() -> None:
    long = [["inc-000003", "open", "fatal", "x" * 500]]
    assert len(render(COLS, long, colour=False).splitlines()) == 2


def test_colour_rendering_styles_words() -> None:
    text = render(COLS, ROWS, colour=True)
    assert "\x1b[31mcritical" in text and "\x1b[32mresolved" in text and "\x1b[1m" in text


def test_colour_decision(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    with (tmp_path / "out").open("w") as piped:
        assert not colour_wanted(piped)
        monkeypatch.setenv("FORCE_COLOR", "1")
        assert colour_wanted(piped)
        monkeypatch.setenv("NO_COLOR", "1")
        assert not colour_wanted(piped)


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(listen=f"127.0.0.1:{free_port()}", http="127.0.0.1:0", db_path=tmp_path / "c.db"),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    ctl.detection.incidents.open(
        Incident(
            id="", kind="gpu_fault", root_cause="node-000/gpu-3", component_type="gpu",
            affected_nodes=["node-000"], affected_jobs=[], severity="critical", action="drain",
            evidence=[], opened_ms=int(time.time() * 1000),
        )
    )  # fmt: skip
    try:
        yield ctl
    finally:
        await ctl.stop()


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR", "TERM")}
    return {**env, "TERM": "xterm-256color", "COLUMNS": "200", **extra}


def _piped(port: int, **env: str) -> str:
    cmd = [sys.executable, "-m", "starpulse.app.cli", "incidents", "--controller", f"127.0.0.1:{port}"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=_env(**env), check=False)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _on_a_pty(port: int, **env: str) -> str:
    """The command's stdout on a pseudo-terminal, as a person at a terminal sees it."""
    main, child = pty.openpty()
    cmd = [sys.executable, "-m", "starpulse.app.cli", "incidents", "--controller", f"127.0.0.1:{port}"]
    proc = subprocess.Popen(cmd, stdout=child, stderr=subprocess.DEVNULL, env=_env(**env))
    os.close(child)
    chunks: list[bytes] = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        ready, _, _ = select.select([main], [], [], 0.5)
        if ready:
            try:
                data = os.read(main, 65536)
            except OSError:  # the child closed its end
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    os.close(main)
    assert proc.wait(timeout=30) == 0
    return b"".join(chunks).decode(errors="replace")


async def test_real_command_colour_follows_the_terminal(controller: Controller) -> None:
    port = controller.grpc_port
    piped = await asyncio.to_thread(_piped, port)
    assert ESC not in piped and piped.splitlines()[0].split()[:2] == ["INCIDENT", "STATE"]
    forced = await asyncio.to_thread(_piped, port, FORCE_COLOR="1")
    assert ESC in forced and "critical" in forced
    on_pty = await asyncio.to_thread(_on_a_pty, port)
    assert ESC in on_pty and "gpu_fault" in on_pty
    no_colour = await asyncio.to_thread(_on_a_pty, port, NO_COLOR="1")
    assert ESC not in no_colour and "gpu_fault" in no_colour
