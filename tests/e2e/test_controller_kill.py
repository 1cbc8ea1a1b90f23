"""The controller killed with SIGKILL mid-stream (no graceful anything) and restarted:
every event the agents emitted is stored exactly once."""

from __future__ import annotations

import asyncio
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from tests.helpers import free_port, make_sim_agent, wait_for


def _start_controller(tmp_path: Path, port: int, log_name: str) -> subprocess.Popen[bytes]:
    with (tmp_path / log_name).open("wb") as log:  # the child keeps its own descriptor
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "starpulse.app.cli",
                "controller",
                "--listen",
                f"127.0.0.1:{port}",
                "--http",
                "127.0.0.1:0",
                "--db",
                str(tmp_path / "c.db"),
                "--heartbeat-timeout-s",
                "30",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )


def _stored(db: Path) -> dict[str, list[int]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute("SELECT node_id, seq FROM events ORDER BY node_id, seq").fetchall()
    out: dict[str, list[int]] = {}
    for node, seq in rows:
        out.setdefault(node, []).append(seq)
    return out


class TestControllerKill:
    async def test_sigkill_mid_stream_loses_and_duplicates_nothing(self, tmp_path: Path) -> None:
        """Events keep coming while the controller is SIGKILLed twice; afterwards seqs are exactly 1..N per node."""
        port = free_port()
        proc = _start_controller(tmp_path, port, "c1.log")
        agents = [make_sim_agent(f"node-{i:03d}", tmp_path, [f"127.0.0.1:{port}"], seed=i) for i in range(3)]
        for a in agents:
            a.start()
        try:
            await wait_for(lambda: all(a.agent.link.connected.is_set() for a in agents), 30, "agents connected")
            n = 0
            for round_ in range(3):
                for _ in range(25):
                    for a in agents:
                        n += 1
                        a.sim.kmsg.xid("0000:0b:00", 5000 + n, "kill test")
                    await asyncio.sleep(0.01)
                if round_ < 2:
                    os.kill(proc.pid, signal.SIGKILL)  # mid-stream, no shutdown path at all
                    proc.wait(timeout=10)
                    for _ in range(10):
                        for a in agents:
                            n += 1
                            a.sim.kmsg.xid("0000:0b:00", 5000 + n, "while down")
                    proc = _start_controller(tmp_path, port, f"c{round_ + 2}.log")
            for a in agents:
                await wait_for(lambda a=a: a.agent.events_emitted == 95, 30, "all findings buffered")
                await wait_for(
                    lambda a=a: a.agent.link.acked_event_seq == a.agent.buffer.next_seq - 1, 30, "all events acked"
                )
            stored = _stored(tmp_path / "c.db")
            for a in agents:
                assert stored[a.agent.config.node_id] == list(range(1, 96)), "lost or duplicated events"
        finally:
            for a in agents:
                await a.halt()
            proc.send_signal(signal.SIGTERM)
            proc.wait(timeout=20)
