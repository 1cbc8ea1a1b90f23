"""Presence persistence: state changes written at once, last-seen times at most every last_seen_flush_s."""

from __future__ import annotations

from pathlib import Path

from controller.ingest.registry import NodeRecord, NodeRegistry
from controller.ingest.verdict import ReportResult
from controller.metrics import ControllerMetrics
from controller.store import Store
from starpulse.core.clock import FakeClock
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import service_pb2 as spb


def _report(node: NodeRecord, seq: int, timestamp_ms: int) -> ReportResult:
    """A decided report, as ingest records it (controller.ingest.decider)."""
    return ReportResult(node.node_id, node.stream_token, 0.0, seq=seq, timestamp_ms=timestamp_ms)


def _stored(store: Store) -> dict[str, tuple[str, int]]:
    return {n.node_id: (n.state, n.last_seen_ms) for n in store.load_nodes()}


def test_last_seen_is_written_every_flush_interval_and_state_changes_at_once(tmp_path: Path) -> None:
    clock = FakeClock(1_000_000)
    store = Store(tmp_path / "c.db")
    reg = NodeRegistry(store, ControllerMetrics(), heartbeat_timeout_s=15, clock=clock, last_seen_flush_s=15)
    node = reg.register(spb.Hello(node_id="node-000", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
    registered_seen = _stored(store)["node-000"][1]

    clock.advance(5)
    reg.record_report(node, _report(node, seq=1, timestamp_ms=clock.time_ms()))
    reg.flush_presence()
    assert _stored(store)["node-000"] == ("online", registered_seen)  # a report alone: not yet

    clock.advance(11)  # 16 s after the registry's last write
    reg.record_report(node, _report(node, seq=2, timestamp_ms=clock.time_ms()))
    reg.flush_presence()
    assert _stored(store)["node-000"] == ("online", clock.time_ms())

    clock.advance(16)  # silent past the heartbeat timeout: unreachable is written at the next flush
    assert [n.node_id for n in reg.sweep()] == ["node-000"]
    reg.flush_presence()
    assert _stored(store)["node-000"][0] == "unreachable"

    clock.advance(1)  # back: online written at once, not 15 s later
    reg.record_report(node, _report(node, seq=3, timestamp_ms=clock.time_ms()))
    reg.flush_presence()
    assert _stored(store)["node-000"] == ("online", clock.time_ms())

    clock.advance(2)
    reg.record_report(node, _report(node, seq=4, timestamp_ms=clock.time_ms()))
    reg.flush_presence(force=True)  # shutdown writes what it has
    assert _stored(store)["node-000"] == ("online", clock.time_ms())
    store.close()


def test_a_round_of_last_seen_times_is_written_a_chunk_per_sweep(tmp_path: Path) -> None:
    """600 nodes heard: the round goes out 250, 250, 100 over three sweeps, then waits for the next round."""
    from controller.ingest.registry import PRESENCE_ROWS_PER_FLUSH

    clock = FakeClock(1_000_000)
    store = Store(tmp_path / "c.db")
    reg = NodeRegistry(store, ControllerMetrics(), heartbeat_timeout_s=60, clock=clock, last_seen_flush_s=15)
    nodes = [
        reg.register(spb.Hello(node_id=f"node-{i:03d}", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
        for i in range(600)
    ]
    clock.advance(16)
    for node in nodes:
        reg.record_report(node, _report(node, seq=1, timestamp_ms=clock.time_ms()))

    def written() -> int:
        return sum(1 for state, seen in _stored(store).values() if seen == clock.time_ms())

    reg.flush_presence()
    assert written() == PRESENCE_ROWS_PER_FLUSH == 250
    reg.flush_presence()
    assert written() == 500
    reg.flush_presence()
    assert written() == 600
    clock.advance(1)
    reg.record_report(nodes[0], _report(nodes[0], seq=2, timestamp_ms=clock.time_ms()))
    reg.flush_presence()  # the round is done: the next one is 15 s away
    assert _stored(store)["node-000"][1] == clock.time_ms() - 1_000
    store.close()


def test_a_last_seen_write_leaves_the_nodes_row_alone(tmp_path: Path) -> None:
    """The time goes to node_last_seen; the nodes row (inventory ~13 kB) is written only for a new state."""
    store = Store(tmp_path / "c.db")
    hello = spb.Hello(node_id="node-000", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e")
    hello.inventory.gpus.add(index=0, uuid="GPU-0")
    reg = NodeRegistry(store, ControllerMetrics(), heartbeat_timeout_s=15, clock=FakeClock(1_000_000))
    reg.register(hello)
    db = store.connection

    def nodes_row_writes(rows: list[tuple[str, str, int]]) -> int:
        before = db.total_changes
        store.update_presence(rows)
        return db.total_changes - before - len(rows)  # minus one node_last_seen row each

    assert nodes_row_writes([("node-000", "online", 2_000_000)]) == 0
    assert _stored(store)["node-000"] == ("online", 2_000_000)
    assert nodes_row_writes([("node-000", "unreachable", 2_000_000)]) == 1
    assert nodes_row_writes([("node-000", "unreachable", 2_100_000)]) == 0
    store.close()
    reopened = Store(tmp_path / "c.db")
    assert _stored(reopened)["node-000"] == ("unreachable", 2_100_000)
    assert len(reopened.load_nodes()[0].inventory.gpus) == 1
    reopened.close()


def test_the_wal_is_checkpointed_off_the_writers_connection(tmp_path: Path) -> None:
    """With the checkpointer on, commits never checkpoint; its thread copies the WAL into the database file."""
    import sqlite3
    import time

    path = tmp_path / "c.db"
    store = Store(path)
    store.start_checkpointer(every_s=0.05)
    reg = NodeRegistry(store, ControllerMetrics(), heartbeat_timeout_s=15, clock=FakeClock(1_000_000))
    reg.register(spb.Hello(node_id="node-000", role=ipb.NODE_ROLE_COMPUTE, buffer_epoch="e"))
    assert store.connection.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 0
    for i in range(50):
        store.update_presence([("node-000", "online", 2_000_000 + i)])

    def in_database_file() -> object:
        """What the database file itself holds, the WAL ignored (immutable=1)."""
        conn = sqlite3.connect(f"file:{path}?immutable=1", uri=True)
        try:
            row = conn.execute("SELECT last_seen_ms FROM node_last_seen WHERE node_id = 'node-000'").fetchone()
            return row[0] if row else None
        except sqlite3.DatabaseError:
            return None
        finally:
            conn.close()

    deadline = time.monotonic() + 10
    while in_database_file() != 2_000_049 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert in_database_file() == 2_000_049
    store.close()
