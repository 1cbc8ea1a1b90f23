"""IncidentStore: incidents and their history in the controller's SQLite database."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.detect.incidents import IncidentStore
from controller.detect.model import Incident


def incident(opened_ms: int, kind: str = "nic_fault", root: str = "node-001/nic-3") -> Incident:
    return Incident(
        id="",
        kind=kind,
        root_cause=root,
        component_type="nic",
        affected_nodes=["node-001"],
        affected_jobs=["llama"],
        severity="critical",
        action="check_link",
        evidence=[{"rule": "nic_link_down", "component": root, "count": 3, "evidence": {"peer": "leaf-b0-r3"}}],
        opened_ms=opened_ms,
        condition_keys=[("nic_link_down", root)],
        updated_ms=opened_ms,
    )


@pytest.fixture
def conn() -> sqlite3.Connection:
    return sqlite3.connect(":memory:", isolation_level=None)


class TestIncidentStore:
    def test_ids_are_short_stable_and_sortable(self, conn):
        """Opened incidents get inc-NNNNNN ids in opening order."""
        store = IncidentStore(conn)
        ids = [store.open(incident(t)).id for t in (10, 20, 30)]
        assert ids == ["inc-000001", "inc-000002", "inc-000003"]
        assert ids == sorted(ids)

    def test_round_trip_keeps_lists_dicts_and_keys(self, conn):
        """get returns the incident as stored: JSON lists, nested evidence and condition key tuples."""
        store = IncidentStore(conn)
        inc = store.open(incident(10))
        got = store.get(inc.id)
        assert got == inc
        assert got is not None and got.condition_keys == [("nic_link_down", "node-001/nic-3")]
        assert store.get("inc-999999") is None

    def test_update_and_resolve(self, conn):
        """update rewrites the row; resolve closes it and removes it from the open list."""
        store = IncidentStore(conn)
        inc = store.open(incident(10))
        inc.severity = "fatal"
        inc.affected_nodes = ["node-001", "node-002"]
        inc.updated_ms = 15
        store.update(inc)
        assert store.get(inc.id) == inc
        store.resolve(inc, 20)
        got = store.get(inc.id)
        assert got is not None and got.resolved_ms == 20 and not got.active
        assert store.load_open() == []
        assert [h["change"] for h in store.history(inc.id)] == ["opened", "updated", "resolved"]

    def test_update_unknown_incident_raises(self, conn):
        """Updating an id that was never stored is an error, not a silent no-op."""
        store = IncidentStore(conn)
        inc = incident(10)
        inc.id = "inc-000042"
        with pytest.raises(KeyError):
            store.update(inc)

    def test_merge_records_pointer(self, conn):
        """A merged incident records which incident absorbed it, in its row and its history."""
        store = IncidentStore(conn)
        small = store.open(incident(10))
        big = store.open(incident(11, kind="switch_fault", root="leaf-b0-r3"))
        store.resolve(small, 12, merged_into=big.id)
        assert store.merged_into(small.id) == big.id
        assert store.history(small.id)[-1]["detail"] == {"merged_into": big.id}

    def test_list_newest_first_with_filters(self, conn):
        """list_incidents is newest first, honours limit, and can show only active ones."""
        store = IncidentStore(conn)
        incs = [store.open(incident(t)) for t in (10, 30, 20)]
        store.resolve(incs[1], 40)
        assert [i.opened_ms for i in store.list_incidents()] == [30, 20, 10]
        assert [i.opened_ms for i in store.list_incidents(limit=2)] == [30, 20]
        assert [i.opened_ms for i in store.list_incidents(active_only=True)] == [20, 10]
        assert store.count() == 3 and store.count(active_only=True) == 2

    def test_open_incidents_survive_reopen(self, tmp_path: Path):
        """Open incidents written through one connection are loaded by a new store on the same file."""
        db = tmp_path / "controller.db"
        c1 = sqlite3.connect(db, isolation_level=None)
        c1.execute("PRAGMA journal_mode=WAL")
        store = IncidentStore(c1)
        a = store.open(incident(10))
        b = store.open(incident(20))
        store.resolve(b, 30)
        c1.close()
        again = IncidentStore(sqlite3.connect(db, isolation_level=None))
        assert [i.id for i in again.load_open()] == [a.id]
        assert again.open(incident(40)).id == "inc-000003"  # ids are never reused

    def test_failed_write_rolls_back(self, conn):
        """A write that fails midway leaves no partial row or history behind."""
        store = IncidentStore(conn)
        bad = incident(10)
        bad.evidence = [{"x": object()}]  # serialised with default=str: fine
        store.open(bad)
        dup = incident(11)
        dup.id = "inc-000001"
        with pytest.raises(sqlite3.IntegrityError):
            store.open(dup)
        assert store.count() == 1
        assert len(store.history("inc-000001")) == 1
        assert not conn.in_transaction
