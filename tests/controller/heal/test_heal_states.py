"""Remediation state machine: allowed transitions, idempotency, restart resume, pending actions."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from controller.heal.states import (
    ALLOWED,
    AUTOMATIC,
    EXTERNAL,
    ForeignDrain,
    InvalidTransition,
    NodeHealState,
    RemediationStore,
    migrate_lifecycle,
)
from starpulse.core.clock import FakeClock

S = NodeHealState


def _open(path: Path, clock: FakeClock) -> RemediationStore:
    return RemediationStore(sqlite3.connect(str(path), isolation_level=None), clock)


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock(1_000_000)


@pytest.fixture
def store(tmp_path: Path, clock: FakeClock) -> RemediationStore:
    return _open(tmp_path / "c.db", clock)


def _walk(store: RemediationStore, node: str, *states: S) -> None:
    for st in states:
        store.transition(node, st, f"to {st}", "inc-000001")


PATH_TO = {
    S.IN_SERVICE: (),
    S.SUSPECT: (S.SUSPECT,),
    S.CORDONED: (S.CORDONED,),
    S.DRAINING: (S.CORDONED, S.DRAINING),
    S.EVICTED: (S.CORDONED, S.DRAINING, S.EVICTED),
    S.REPAIRING: (S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING),
    S.VALIDATING: (S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING),
    S.SPARE: (S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING, S.SPARE),
    S.RETIRED: (S.CORDONED, S.DRAINING, S.EVICTED, S.RETIRED),
}

CASES = [(a, b, b in ALLOWED[a] or a == b) for a in S for b in S]


@pytest.mark.parametrize(("start", "to", "ok"), CASES, ids=[f"{a}->{b}" for a, b, _ in CASES])
def test_transition_table(store: RemediationStore, start: S, to: S, ok: bool) -> None:
    _walk(store, "node-001", *PATH_TO[start])
    assert store.state("node-001") == start
    if ok:
        t = store.transition("node-001", to, "test", "inc-000002")
        assert t is not None and t.from_state == start and t.to_state == to
        assert store.state("node-001") == to
    else:
        with pytest.raises(InvalidTransition) as err:
            store.transition("node-001", to, "test", "inc-000002")
        assert f"from {start.value!r} to {to.value!r}" in str(err.value)
        assert store.state("node-001") == start


def test_expected_lifecycle_is_allowed(store: RemediationStore) -> None:
    _walk(store, "n", S.SUSPECT, S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING, S.SPARE, S.IN_SERVICE)
    assert [t.to_state for t in store.history("n")] == [
        S.SUSPECT,
        S.CORDONED,
        S.DRAINING,
        S.EVICTED,
        S.REPAIRING,
        S.VALIDATING,
        S.SPARE,
        S.IN_SERVICE,
    ]


def test_unknown_node_is_in_service(store: RemediationStore) -> None:
    rec = store.record("node-404")
    assert rec.state == S.IN_SERVICE and rec.drained_by is None and rec.repair_loops == 0
    assert store.history("node-404") == []


def test_idempotent_same_state_same_incident(store: RemediationStore) -> None:
    assert store.transition("n", S.CORDONED, "xid 79", "inc-1") is not None
    assert store.transition("n", S.CORDONED, "xid 79 again", "inc-1") is None
    assert len(store.history("n")) == 1
    # the same state for a new incident re-attaches the node (recorded, no state change)
    t = store.transition("n", S.CORDONED, "second fault", "inc-2")
    assert t is not None and t.from_state == S.CORDONED
    assert store.record("n").incident_id == "inc-2"
    assert len(store.history("n")) == 2


def test_history_records_actor_reason_incident_and_time(store: RemediationStore, clock: FakeClock) -> None:
    store.transition("n", S.CORDONED, "xid 79 on gpu-3", "inc-7")
    clock.advance(30)
    store.transition("n", S.IN_SERVICE, "false alarm", "inc-7", actor="alice")
    h = store.history("n")
    assert [(t.actor, t.reason, t.incident_id) for t in h] == [
        (AUTOMATIC, "xid 79 on gpu-3", "inc-7"),
        ("alice", "false alarm", "inc-7"),
    ]
    assert h[1].at_ms - h[0].at_ms == 30_000
    assert store.history("n", since_ms=h[1].at_ms) == [h[1]]


def test_drained_by_and_nodes_in(store: RemediationStore) -> None:
    store.transition("a", S.CORDONED, "r", "i1")
    store.transition("b", S.CORDONED, "maintenance", None, actor="bob")
    store.transition("b", S.DRAINING, "r", "i2")  # our drain on bob's node keeps bob as owner
    assert store.drained_by("a") == AUTOMATIC
    assert store.drained_by("b") == "bob"
    assert store.nodes_in("cordoned") == ["a"]
    assert store.nodes_in(S.DRAINING) == ["b"]
    store.transition("a", S.IN_SERVICE, "resolved", "i1")
    assert store.drained_by("a") is None


def test_automatic_resume_of_foreign_drain_is_refused(store: RemediationStore) -> None:
    store.record_external_drain("n", EXTERNAL, "slurm shows DRAIN")
    assert store.state("n") == S.CORDONED and store.drained_by("n") == EXTERNAL
    with pytest.raises(ForeignDrain):
        store.transition("n", S.IN_SERVICE, "incident resolved", None)
    assert store.transition("n", S.IN_SERVICE, "done with maintenance", None, actor="carol") is not None


def test_record_external_drain_on_our_node_takes_ownership(store: RemediationStore) -> None:
    store.transition("n", S.CORDONED, "r", "i1")
    t = store.record_external_drain("n", "dave", "dave drained it too")
    assert t is not None and t.from_state == t.to_state == S.CORDONED
    assert store.drained_by("n") == "dave"
    assert store.record_external_drain("n", "dave") is None  # idempotent


def test_repair_loops_counted_and_reset(store: RemediationStore) -> None:
    for _ in range(2):
        _walk(store, "n", S.CORDONED, S.DRAINING, S.EVICTED, S.REPAIRING, S.VALIDATING, S.SPARE, S.IN_SERVICE)
    assert store.repair_loops("n") == 2
    with pytest.raises(ValueError, match="named person"):
        store.reset_repair_loops("n", AUTOMATIC)
    store.reset_repair_loops("n", "erin")
    assert store.repair_loops("n") == 0


def test_restart_resume(tmp_path: Path, clock: FakeClock) -> None:
    a = _open(tmp_path / "c.db", clock)
    _walk(a, "node-001", S.CORDONED, S.DRAINING)
    a.transition("node-002", S.CORDONED, "maint", None, actor="bob")
    a.conn.close()
    b = _open(tmp_path / "c.db", clock)
    assert b.state("node-001") == S.DRAINING
    assert b.record("node-001").incident_id == "inc-000001"
    assert b.drained_by("node-002") == "bob"
    assert [t.to_state for t in b.history("node-001")] == [S.CORDONED, S.DRAINING]
    # the resumed controller continues where it left off, idempotently
    assert b.transition("node-001", S.DRAINING, "again", "inc-000001") is None
    assert b.transition("node-001", S.EVICTED, "drained", "inc-000001") is not None


def test_invalid_state_name(store: RemediationStore) -> None:
    with pytest.raises(ValueError):
        store.transition("n", "broken", "r", None)


# -- pending actions -----------------------------------------------------------------------


def test_plan_mark_replay_exactly_once(tmp_path: Path, clock: FakeClock) -> None:
    a = _open(tmp_path / "c.db", clock)
    cordon = a.plan_action("n", "cordon", "inc-1")
    drain = a.plan_action("n", "drain", "inc-1")
    assert a.plan_action("n", "cordon", "inc-1") == cordon  # replanning is idempotent
    a.mark_action(cordon.action_id, "done")
    a.conn.close()  # crash between acting on the drain and marking it

    b = _open(tmp_path / "c.db", clock)
    replay = b.planned()
    assert [x.action_id for x in replay] == [drain.action_id]
    done = b.mark_action(drain.action_id, "done")
    assert done.status == "done" and done.attempts == 1
    assert b.planned() == []
    assert b.plan_action("n", "drain", "inc-1").status == "done"  # a replayed decision plans nothing new


def test_failed_action_is_replanned_with_attempts(store: RemediationStore) -> None:
    act = store.plan_action("n", "requeue", "inc-1", job="job-42")
    failed = store.mark_action(act.action_id, "failed", "scontrol: timeout")
    assert failed.last_error == "scontrol: timeout" and failed.attempts == 1
    assert store.planned() == []
    again = store.plan_action("n", "requeue", "inc-1", job="job-42")
    assert again.action_id == act.action_id and again.status == "planned" and again.attempts == 1
    assert store.plan_action("n", "requeue", "inc-1", job="job-43").action_id != act.action_id


def test_action_validation(store: RemediationStore) -> None:
    with pytest.raises(ValueError, match="unknown action kind"):
        store.plan_action("n", "format_disk", None)
    act = store.plan_action("n", "reboot", None)
    with pytest.raises(ValueError, match="unknown action status"):
        store.mark_action(act.action_id, "maybe")
    with pytest.raises(KeyError):
        store.mark_action("act-999999", "done")
    assert [x.kind for x in store.actions("n")] == ["reboot"]


def test_state_keeps_since_and_why(store: RemediationStore, clock: FakeClock) -> None:
    store.transition("n", S.CORDONED, "xid 79 on gpu-3", "inc-7")
    clock.advance(12)
    store.transition("n", S.DRAINING, "evict for xid 79", "inc-7")
    rec = store.record("n")
    assert rec.state == S.DRAINING and rec.reason == "evict for xid 79"
    assert rec.since_ms == clock.time_ms()


_OLD_SCHEMA = """
CREATE TABLE heal_nodes (node TEXT PRIMARY KEY, state TEXT NOT NULL, since_ms INTEGER NOT NULL,
    incident_id TEXT, drained_by TEXT, repair_loops INTEGER NOT NULL DEFAULT 0, updated_ms INTEGER NOT NULL);
CREATE TABLE heal_transitions (id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, from_state TEXT NOT NULL,
    to_state TEXT NOT NULL, reason TEXT NOT NULL, incident_id TEXT, actor TEXT NOT NULL, at_ms INTEGER NOT NULL);
INSERT INTO heal_nodes VALUES ('a', 'in_repair', 5, 'inc-1', 'starpulse', 1, 5);
INSERT INTO heal_nodes VALUES ('b', 'returned', 7, 'inc-2', 'starpulse', 1, 7);
INSERT INTO heal_nodes VALUES ('c', 'healthy', 9, NULL, NULL, 0, 9);
INSERT INTO heal_transitions(node, from_state, to_state, reason, incident_id, actor, at_ms)
    VALUES ('a', 'evicted', 'in_repair', 'reboot requested', 'inc-1', 'starpulse', 5);
INSERT INTO heal_transitions(node, from_state, to_state, reason, incident_id, actor, at_ms)
    VALUES ('c', 'draining', 'healthy', 'resolved', NULL, 'alice', 9);
"""


def test_store_from_before_the_lifecycle_names_is_migrated_once(tmp_path: Path, clock: FakeClock) -> None:
    conn = sqlite3.connect(str(tmp_path / "old.db"), isolation_level=None)
    conn.executescript(_OLD_SCHEMA)
    store = RemediationStore(conn, clock)
    assert {r.node: r.state for r in store.all_records()} == {"a": S.REPAIRING, "b": S.SPARE, "c": S.IN_SERVICE}
    assert store.record("a").reason == "reboot requested" and store.record("b").reason == ""
    assert [(t.from_state, t.to_state) for t in store.history("c")] == [(S.DRAINING, S.IN_SERVICE)]
    assert migrate_lifecycle(conn) == 0  # a migrated store changes nothing
    store.transition("a", S.VALIDATING, "reset done", "inc-1")  # and it goes on from the new names
    assert store.record("a").reason == "reset done"
