"""Issue 32 item 4: damaged state is survived, not fatal.

Probes, as a crash, a full disk or a stray write would leave the files:

- the agent's buffer truncated to half (a crash mid-write on a filesystem that lost the tail);
- the agent's buffer overwritten with garbage (not a database at all);
- the agent's buffer an empty file (what SQLite makes of a new one: no reset);
- the agent's buffer whose own bookkeeping is garbled (next_seq not a number): reset, the
  events it still showed counted as possibly lost;
- the controller's database truncated, and garbage: one line naming the file and what to do,
  from the real ``starpulse controller`` command, exit 2, no traceback.

For the agent, what must hold: it starts, the damaged file is moved aside with a timestamp, a
fresh buffer (a new epoch) starts, the controller stores the agent's BUFFER_RESET event (with
how many unsent events may be lost) and raises an alert, and reports keep flowing.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from agent.transport.buffer import EventBuffer
from controller.service import Controller, ControllerConfig
from controller.store import Store, StoreError
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import telemetry_pb2 as tpb
from tests.helpers import free_port, make_sim_agent, wait_for

NODE = "node-000"


@pytest.fixture
async def controller(tmp_path: Path) -> AsyncIterator[Controller]:
    ctl = Controller(
        ControllerConfig(
            listen=f"127.0.0.1:{free_port()}",
            http="127.0.0.1:0",
            db_path=tmp_path / "ctl" / "c.db",
            allowed_nodes=[NODE],
        ),
        clock=SYSTEM_CLOCK,
    )
    await ctl.start()
    yield ctl
    await ctl.stop()


def _filled_buffer(path: Path, events: int = 300) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    buffer = EventBuffer(path)
    for _ in range(events):
        buffer.append(
            tpb.Event(kind=tpb.EVENT_KIND_XID, severity=tpb.SEVERITY_WARNING, component="gpu-0", message="x" * 200)
        )
    buffer.close()


def _truncate_half(path: Path) -> None:
    with path.open("r+b") as f:
        f.truncate(path.stat().st_size // 2)


def _reset_events(ctl: Controller) -> list[tpb.Event]:
    return [
        row.event for row in ctl.store.list_events(NODE, limit=1000) if row.event.kind == tpb.EVENT_KIND_BUFFER_RESET
    ]


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
async def test_agent_survives_a_damaged_buffer(controller: Controller, tmp_path: Path, damage: str) -> None:
    buffer_path = tmp_path / NODE / "buffer.db"
    if damage == "truncated":
        _filled_buffer(buffer_path)
        _truncate_half(buffer_path)
    else:
        buffer_path.parent.mkdir(parents=True)
        buffer_path.write_bytes(os.urandom(16384))
    agent = make_sim_agent(NODE, tmp_path, [f"127.0.0.1:{controller.grpc_port}"], interval_s=0.2)
    agent.start()
    try:
        reset = agent.agent.buffer.reset
        assert reset is not None and reset.moved_to.exists()
        assert reset.moved_to.name.startswith("buffer.db.damaged-")
        await wait_for(lambda: len(_reset_events(controller)) == 1, what="the BUFFER_RESET event at the controller")
        [event] = _reset_events(controller)
        assert event.attributes["moved_to"] == reset.moved_to.name
        assert event.attributes["lost"] == "unknown"  # neither file can be read for a count
        await wait_for(
            lambda: any(
                "agent.buffer_reset" in {rule for rule, _ in i.condition_keys}
                for i in controller.detection.correlator.incidents()
            ),
            what="an alert for the damaged buffer",
        )
        seq = controller.registry.nodes[NODE].acked_report_seq
        await wait_for(lambda: controller.registry.nodes[NODE].acked_report_seq > seq + 2, what="reports keep coming")
    finally:
        await agent.halt()
    # The next start opens the fresh buffer as it is: no second reset.
    assert EventBuffer(buffer_path).reset is None


def test_an_empty_buffer_file_is_just_a_new_buffer(tmp_path: Path) -> None:
    """Zero bytes is what SQLite makes of a new file: not damage, no reset event."""
    path = tmp_path / "buffer.db"
    path.write_bytes(b"")
    buffer = EventBuffer(path)
    assert buffer.reset is None and buffer.depth() == 0


def test_buffer_reset_event_counts_what_was_readable(tmp_path: Path) -> None:
    """A file that opens but whose own bookkeeping is garbled (next_seq not a number): moved aside,
    and the unsent events it still showed are counted in the reset event."""
    path = tmp_path / "buffer.db"
    _filled_buffer(path, events=5)
    db = sqlite3.connect(path)
    db.execute("UPDATE meta SET value = 'garbled' WHERE key = 'next_seq'")
    db.commit()
    db.close()
    buffer = EventBuffer(path)
    assert buffer.reset is not None and buffer.reset.lost == 5
    [event] = buffer.pending(0)
    assert event.kind == tpb.EVENT_KIND_BUFFER_RESET and event.seq == 1
    assert event.attributes["lost"] == "5"
    assert buffer.epoch  # a new epoch: the controller does not take seq 1 for a replay


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_controller_refuses_a_damaged_database_with_one_line(tmp_path: Path, damage: str) -> None:
    db = tmp_path / "c.db"
    if damage == "truncated":
        store = Store(db)
        for i in range(200):
            store.connection.execute(
                "INSERT INTO node_last_seen(node_id, last_seen_ms) VALUES (?, ?)", (f"node-{i:03d}" + "x" * 200, i)
            )
        store.close()
        _truncate_half(db)
    else:
        db.write_bytes(os.urandom(16384))
    with pytest.raises(StoreError) as err:
        Store(db)
    [line] = err.value.errors
    assert str(db) in line and "damaged" in line and ".recover" in line
    # The real command: exit 2, the line, no traceback.
    proc = subprocess.run(
        [sys.executable, "-m", "starpulse.app.cli", "controller", "--db", str(db), "--listen", "127.0.0.1:0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert proc.returncode == 2, proc.stderr
    assert f"controller database {db} is damaged" in proc.stderr
    assert "Traceback" not in proc.stderr
