"""One real ``starpulse agent`` process streaming to an in-process controller, for the end-to-end tests."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path

from controller.service import Controller
from tests.helpers import wait_for

ROOT = Path(__file__).resolve().parents[2]


@asynccontextmanager
async def agent_process(
    ctl: Controller, tmp_path: Path, backend: str, env: Mapping[str, str], what: str, node: str = "node-001"
) -> AsyncIterator[None]:
    """The agent of ``node`` on ``backend`` (0.3 s cycles, no kernel log), running until its first
    report reached ``ctl``; stopped on the way out, where its log must hold no traceback."""
    log_path = tmp_path / "agent.log"
    log = log_path.open("w")
    agent = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "starpulse.app.cli", "agent", "--controller", f"127.0.0.1:{ctl.grpc_port}"),
        *("--node-id", node, "--backend", backend, "--interval-s", "0.3", "--kmsg", ""),
        *("--state-dir", str(tmp_path / "agent")),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=ROOT,
        env=dict(env),
    )
    try:
        await wait_for(
            lambda: (n := ctl.registry.nodes.get(node)) is not None and n.latest_report is not None, 30, what
        )
        yield
    finally:
        agent.terminate()
        await asyncio.wait_for(agent.wait(), 20)
        log.close()
    assert "Traceback" not in log_path.read_text()
