"""The state mirror and the fenced scheduler against a real etcd."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aetcd
import pytest

from controller.ha.config import HAConfig
from controller.ha.election import Elector, NotLeader
from controller.ha.etcd import connect
from controller.ha.fenced import FencedScheduler
from controller.ha.mirror import StateMirror, decode_row, encode_row
from controller.heal.scheduler.sim import SimScheduler
from controller.heal.spares import SparePool
from controller.heal.states import NodeHealState, RemediationStore
from controller.store import Store, StoredNode
from starpulse.core.clock import SYSTEM_CLOCK
from starpulse.v1 import inventory_pb2 as ipb
from starpulse.v1 import telemetry_pb2 as tpb
from tests.etcd_server import EtcdServer
from tests.helpers import wait_for


@dataclass
class Replica:
    store: Store
    heal: RemediationStore
    elector: Elector
    mirror: StateMirror


@pytest.fixture
async def make(etcd: EtcdServer, tmp_path: Path) -> AsyncIterator[object]:
    config = HAConfig(etcd=[etcd.endpoint])
    made: list[tuple[aetcd.Client, Store]] = []

    async def factory(name: str) -> Replica:
        client = await connect(config)
        store = Store(tmp_path / f"{name}.db")
        heal = RemediationStore(store.connection, SYSTEM_CLOCK)
        SparePool(None, lambda n: True, heal)  # its tables too
        elector = Elector(client, config.key("leader"), f"{name}:1", 2, poll_interval_s=0.05)
        made.append((client, store))
        return Replica(store, heal, elector, StateMirror(store.connection, client, config, elector))

    yield factory
    for client, store in made:
        await client.close()
        store.close()


def node(node_id: str, state: str = "online", seen: int = 1, acked: int = 0) -> StoredNode:
    return StoredNode(node_id, ipb.NODE_ROLE_COMPUTE, state, 1, seen, "1.0", "h", ipb.Inventory(), "ep", acked)


class TestRowCodec:
    def test_blobs_and_nulls_round_trip(self) -> None:
        """Every SQLite value type survives the JSON encoding."""
        row = decode_row(encode_row(["a", "b", "c", "d"], (b"\x00\xff", None, 3, "x")))
        assert row == {"a": b"\x00\xff", "b": None, "c": 3, "d": "x"}


class TestStateMirror:
    async def test_new_leader_restores_what_the_old_one_flushed(self, make) -> None:  # type: ignore[no-untyped-def]
        """Node states, transitions, planned actions, nodes and events (with BLOBs) arrive in a fresh replica."""
        a = await make("a")
        assert await a.elector.campaign(asyncio.Event())
        a.store.upsert_node(node("node-001"))
        ev = tpb.Event(
            seq=1,
            timestamp_ms=5,
            kind=tpb.EVENT_KIND_XID,
            severity=tpb.SEVERITY_CRITICAL,
            xid=79,
            component="gpu-2",
            message="xid 79",
        )
        a.store.insert_events("node-001", "ep", [ev], received_ms=6, acked_event_seq=1)
        a.heal.transition("node-001", NodeHealState.SUSPECT, "xid 79", "inc-1")
        planned = a.heal.plan_action("node-001", "drain", "inc-1")
        assert a.mirror.pending() > 0
        assert await a.mirror.flush() > 0 and a.mirror.pending() == 0
        await a.elector.resign()

        b = await make("b")
        await b.mirror.restore()
        assert b.heal.state("node-001") == NodeHealState.SUSPECT
        assert [p.action_id for p in b.heal.planned()] == [planned.action_id]
        assert [t.to_state for t in b.heal.history("node-001")] == [NodeHealState.SUSPECT]
        (stored,) = b.store.load_nodes()
        assert stored.acked_event_seq == 1 and stored.buffer_epoch == "ep"
        assert [r.event for r in b.store.list_events("node-001")] == [ev]
        assert b.mirror.pending() == 0  # restoring is not a change to send back

    async def test_deletes_and_replaces_are_mirrored(self, make) -> None:  # type: ignore[no-untyped-def]
        """A deleted row disappears from a restored replica; a REPLACE leaves one row, not two."""
        a = await make("a")
        assert await a.elector.campaign(asyncio.Event())
        db = a.store.connection
        sql = "INSERT OR REPLACE INTO heal_spares(node, marked_by, marked_ms) VALUES (?, ?, ?)"
        db.execute(sql, ("node-008", "ops", 1))
        db.execute(sql, ("node-009", "ops", 1))
        await a.mirror.flush()
        db.execute("DELETE FROM heal_spares WHERE node = 'node-009'")
        db.execute(sql, ("node-008", "alice", 2))  # the old row is deleted, a new rowid inserted
        await a.mirror.flush()
        b = await make("b")
        await b.mirror.restore()
        rows = b.store.connection.execute("SELECT node, marked_by FROM heal_spares").fetchall()
        assert rows == [("node-008", "alice")]
        await a.elector.resign()

    async def test_presence_only_updates_are_not_mirrored(self, make) -> None:  # type: ignore[no-untyped-def]
        """The heartbeat sweep's last_seen updates stay local; a state change is mirrored."""
        a = await make("a")
        a.store.upsert_node(node("node-001"))
        a.store.connection.execute("DELETE FROM ha_changes")
        a.store.update_presence([("node-001", "online", 99)])
        assert a.mirror.pending() == 0
        a.store.update_presence([("node-001", "unreachable", 100)])
        assert a.mirror.pending() == 1

    async def test_standby_follows_the_leaders_writes(self, make) -> None:  # type: ignore[no-untyped-def]
        """A standby's follow() applies puts and deletes as the leader flushes them."""
        a, b = await make("a"), await make("b")
        assert await a.elector.campaign(asyncio.Event())
        follower = asyncio.create_task(b.mirror.follow())
        try:
            a.heal.transition("node-002", NodeHealState.SUSPECT, "r", "inc-2")
            await a.mirror.flush()
            await wait_for(lambda: b.heal.state("node-002") == NodeHealState.SUSPECT, 5, "the standby to follow")
            a.heal.transition("node-002", NodeHealState.CORDONED, "r", "inc-2")
            await a.mirror.flush()
            await wait_for(lambda: b.heal.state("node-002") == NodeHealState.CORDONED, 5, "the update")
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
        await a.elector.resign()

    async def test_deposed_leader_cannot_flush(self, make) -> None:  # type: ignore[no-untyped-def]
        """Once another replica leads, the old leader's flush is refused whole and nothing of it lands."""
        a, b = await make("a"), await make("b")
        assert await a.elector.campaign(asyncio.Event())
        await b.elector.client.revoke_lease(a.elector.lease.id)
        assert await b.elector.campaign(asyncio.Event())
        a.heal.transition("node-003", NodeHealState.SUSPECT, "stale", "inc-3")
        with pytest.raises(NotLeader):
            await a.mirror.flush()
        assert a.elector.lost.is_set()
        assert a.mirror.pending() > 0  # kept locally, never sent
        await b.mirror.restore()
        assert b.heal.state("node-003") == NodeHealState.IN_SERVICE
        await a.elector.close()
        await b.elector.resign()


class TestFencedScheduler:
    async def test_deposed_leader_cannot_act(self, make) -> None:  # type: ignore[no-untyped-def]
        """Drain from a replica whose lease is gone: NotLeader, and the scheduler saw nothing."""
        a, b = await make("a"), await make("b")
        sim = SimScheduler(["node-001"])
        fenced = FencedScheduler(sim, a.elector, a.mirror)
        assert await a.elector.campaign(asyncio.Event())
        await b.elector.client.revoke_lease(a.elector.lease.id)
        assert await b.elector.campaign(asyncio.Event())
        with pytest.raises(NotLeader):
            await fenced.drain("node-001", "xid 79")
        assert sim.actions == []
        await a.elector.close()
        await b.elector.resign()

    async def test_action_flushes_its_plan_first_and_is_never_done_twice(self, make) -> None:  # type: ignore[no-untyped-def]
        """The planned row reaches etcd before the drain; a replayed drain reads back 'done' and is skipped."""
        a = await make("a")
        sim = SimScheduler(["node-001", "node-003"])
        fenced = FencedScheduler(sim, a.elector, a.mirror)
        assert await a.elector.campaign(asyncio.Event())
        a.heal.plan_action("node-001", "drain", "inc-1")
        assert a.mirror.pending() > 0
        assert (await fenced.drain("node-001", "xid 79")).ok
        assert a.mirror.pending() == 0  # the plan went to etcd before the action
        assert (await fenced.drain("node-001", "xid 79 (replayed)")).ok
        assert [x[:2] for x in sim.actions] == [("drain", "node-001")]
        assert fenced.skipped == [("drain", "node-001")]
        sim.add_job("train", ["node-001", "node-002"])
        assert (await fenced.requeue("train", ["node-001"], [])).ok
        assert (await fenced.requeue("train", ["node-001"], [])).ok
        assert [x[0] for x in sim.actions].count("requeue") == 1
        assert sim.jobs["train"].nodes == ["node-002", "node-003"]
        await a.elector.resign()
