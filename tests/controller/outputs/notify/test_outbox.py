"""The notification outbox (idempotency, per-incident ordering, restart) and what the Notifier queues."""

from __future__ import annotations

import json
import random
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.detect.model import Incident
from controller.outputs.notify.config import BackoffConfig, NotifyConfig, ReceiverConfig
from controller.outputs.notify.notifier import Notifier
from controller.outputs.notify.outbox import Outbox
from starpulse.core.clock import FakeClock


def connect(path: Path) -> sqlite3.Connection:
    """As the controller's store opens it: autocommit, WAL."""
    conn = sqlite3.connect(str(path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    return conn


@pytest.fixture
def db(tmp_path: Path) -> Iterator[sqlite3.Connection]:
    conn = connect(tmp_path / "c.db")
    yield conn
    conn.close()


class TestOutbox:
    def test_enqueue_is_idempotent(self, db: sqlite3.Connection) -> None:
        ob = Outbox(db, FakeClock(1_000_000))
        first = ob.enqueue("r", "inc-1#1.0", "firing", "{}", group="inc-1")
        assert first is not None
        assert ob.enqueue("r", "inc-1#1.0", "firing", '{"other": 1}', group="inc-1") is None
        assert ob.enqueue("r", "inc-1#1", "resolved", "{}", group="inc-1") is not None
        assert ob.enqueue("r", "inc-1#1", "resolved", "{}", group="inc-1") is None
        assert ob.enqueue("other", "inc-1#1.0", "firing", "{}", group="inc-1") is not None  # per receiver
        assert ob.pending_count() == 3 and ob.pending_count("r") == 2
        item = ob.get(first)
        assert item is not None and item.payload == "{}"  # the first one stands

    def test_delivery_id_is_stable_and_distinct(self, db: sqlite3.Connection) -> None:
        ob = Outbox(db, FakeClock(1_000_000))
        a = ob.get(ob.enqueue("r", "k", "firing", "{}") or 0)
        b = ob.get(ob.enqueue("r", "k", "resolved", "{}") or 0)
        assert a is not None and b is not None
        assert len(a.delivery_id) == 32 and a.delivery_id != b.delivery_id

    def test_resolved_waits_for_its_firing_notice(self, db: sqlite3.Connection) -> None:
        clock = FakeClock(1_000_000)
        ob = Outbox(db, clock)
        fire = ob.enqueue("r", "inc-1#1.0", "firing", "f", group="inc-1")
        res = ob.enqueue("r", "inc-1#1", "resolved", "r", group="inc-1")
        other = ob.enqueue("r", "inc-2#1.0", "firing", "o", group="inc-2")
        assert fire and res and other
        assert [i.id for i in ob.due(clock.time_ms())] == [fire, other]  # one head per incident
        ob.mark_failed(fire, "HTTP 503", clock.time_ms() + 5000)
        assert [i.id for i in ob.due(clock.time_ms())] == [other]  # resolved still held back by the firing one
        assert ob.next_due_ms() == clock.time_ms()
        ob.mark_delivered(other)
        assert ob.due(clock.time_ms()) == [] and ob.next_due_ms() == clock.time_ms() + 5000
        clock.advance(5)
        assert [i.id for i in ob.due(clock.time_ms())] == [fire]
        ob.mark_delivered(fire)
        assert [i.id for i in ob.due(clock.time_ms())] == [res]
        ob.mark_delivered(res)
        assert ob.pending_count() == 0 and ob.next_due_ms() is None

    def test_permanent_failure_unblocks_the_group(self, db: sqlite3.Connection) -> None:
        ob = Outbox(db, FakeClock(1_000_000))
        fire = ob.enqueue("r", "a", "firing", "f", group="inc-1")
        res = ob.enqueue("r", "b", "resolved", "r", group="inc-1")
        assert fire and res
        ob.mark_failed(fire, "HTTP 400: bad", None)
        item = ob.get(fire)
        assert item is not None and item.state == "failed" and item.attempts == 1 and item.last_error == "HTTP 400: bad"
        assert [i.id for i in ob.due()] == [res]
        assert ob.pending_count() == 1

    def test_survives_reopen(self, tmp_path: Path) -> None:
        path = tmp_path / "c.db"
        conn = connect(path)
        ob = Outbox(conn, FakeClock(1_000_000))
        fire = ob.enqueue("r", "inc-1#1.0", "firing", '{"a": 1}', group="inc-1")
        assert fire is not None
        ob.mark_failed(fire, "connection refused", 2_000_000)
        ob.set_state("r", "inc-1", 1, 0, "firing", "critical", '{"labels": {}}')
        conn.close()

        conn = connect(path)
        ob = Outbox(conn, FakeClock(2_000_000))
        assert ob.pending_count() == 1
        (item,) = ob.due()
        assert item.id == fire and item.attempts == 1 and item.payload == '{"a": 1}'
        assert ob.enqueue("r", "inc-1#1.0", "firing", "{}", group="inc-1") is None  # still deduplicated
        st = ob.state("r", "inc-1")
        assert st is not None and st.state == "firing" and st.episode == 1
        assert [a.incident_id for a in ob.active("r")] == ["inc-1"]
        conn.close()

    def test_purge_keeps_what_deduplicates_firing_incidents(self, db: sqlite3.Connection) -> None:
        clock = FakeClock(1_000_000)
        ob = Outbox(db, clock)
        for inc, state in (("inc-1", "firing"), ("inc-2", "resolved")):
            i = ob.enqueue("r", f"{inc}#1.0", "firing", "{}", group=inc)
            assert i is not None
            ob.mark_delivered(i)
            ob.set_state("r", inc, 1, 0, state, "warning", "{}")
        pending = ob.enqueue("r", "inc-3#1.0", "firing", "{}", group="inc-3")
        clock.advance(10)
        assert ob.purge(clock.time_ms()) == 1
        assert [i.group for i in ob.items()] == ["inc-1", "inc-3"]
        assert ob.get(pending or 0) is not None
        assert ob.state("r", "inc-2") is None and ob.state("r", "inc-1") is not None


def incident(**kw: Any) -> Incident:
    base: dict[str, Any] = {
        "id": "inc-000001",
        "kind": "gpu_fault",
        "root_cause": "node-001/gpu-2",
        "component_type": "gpu",
        "affected_nodes": ["node-001"],
        "affected_jobs": [],
        "severity": "critical",
        "action": "reboot",
        "evidence": [],
        "opened_ms": 1_000_000,
        "updated_ms": 1_000_000,
    }
    base.update(kw)
    return Incident(**base)


def notifier(db: sqlite3.Connection, *receivers: ReceiverConfig) -> Notifier:
    clock = FakeClock(1_000_000)
    return Notifier(NotifyConfig(receivers=list(receivers)), Outbox(db, clock), clock, rng=random.Random(1))


def hook(name: str = "hook", **kw: Any) -> ReceiverConfig:
    return ReceiverConfig(name=name, type="alertmanager_webhook", url="http://127.0.0.1:1/", **kw)


def statuses(n: Notifier, receiver: str = "hook") -> list[tuple[str, str]]:
    return [(i.dedup_key, i.status) for i in n.outbox.items(receiver)]


class TestNotifierQueueing:
    def test_open_update_resolve(self, db: sqlite3.Connection) -> None:
        n = notifier(db, hook())
        inc = incident()
        n.on_incident("opened", inc)
        n.on_incident("opened", inc)  # re-published: no duplicate
        n.on_incident("updated", incident(affected_nodes=["node-001", "node-002"], updated_ms=1_000_500))
        n.on_incident("resolved", incident(resolved_ms=1_002_000))
        n.on_incident("resolved", incident(resolved_ms=1_002_000))
        assert statuses(n) == [("inc-000001#1.0", "firing"), ("inc-000001#1", "resolved")]
        firing, resolved = (json.loads(i.payload) for i in n.outbox.items("hook"))
        assert firing["version"] == "4" and firing["status"] == "firing" and firing["receiver"] == "hook"
        assert resolved["status"] == "resolved" and resolved["alerts"][0]["endsAt"].startswith("1970-01-01T00:16:42")
        assert n.outbox_depth() == 2

    def test_routing_and_send_resolved(self, db: sqlite3.Connection) -> None:
        n = notifier(
            db,
            hook("crit", min_severity="critical"),
            hook("net", kinds=["link_fault"]),
            hook("quiet", send_resolved=False),
        )
        n.on_incident("opened", incident(severity="warning"))
        assert statuses(n, "crit") == [] and statuses(n, "net") == []
        assert statuses(n, "quiet") == [("inc-000001#1.0", "firing")]
        n.on_incident("resolved", incident(severity="warning", resolved_ms=1_001_000))
        assert statuses(n, "quiet") == [("inc-000001#1.0", "firing")]
        assert statuses(n, "crit") == []  # never told it fired: no resolved notice either

    def test_escalation_past_min_severity_sends_it(self, db: sqlite3.Connection) -> None:
        n = notifier(db, hook(min_severity="critical"))
        n.on_incident("opened", incident(severity="warning"))
        n.on_incident("updated", incident(severity="fatal"))
        assert statuses(n) == [("inc-000001#1.0", "firing")]
        assert json.loads(n.outbox.items()[0].payload)["commonLabels"]["severity"] == "fatal"

    def test_severity_change_refires_and_ends_the_old_labels(self, db: sqlite3.Connection) -> None:
        n = notifier(db, hook())
        n.on_incident("opened", incident(severity="warning"))
        n.on_incident("updated", incident(severity="critical"))
        n.on_incident("updated", incident(severity="critical"))
        n.on_incident("resolved", incident(severity="critical", resolved_ms=1_003_000))
        assert statuses(n) == [
            ("inc-000001#1.0", "firing"),
            ("inc-000001#1.1", "firing"),
            ("inc-000001#1", "resolved"),
        ]
        refire = json.loads(n.outbox.items()[1].payload)
        assert [(a["status"], a["labels"]["severity"]) for a in refire["alerts"]] == [
            ("firing", "critical"),
            ("resolved", "warning"),
        ]
        resolved = json.loads(n.outbox.items()[2].payload)
        assert resolved["alerts"][0]["labels"]["severity"] == "critical"

    def test_reopened_incident_is_a_new_episode(self, db: sqlite3.Connection) -> None:
        n = notifier(db, hook())
        n.on_incident("opened", incident())
        n.on_incident("resolved", incident(resolved_ms=1_001_000))
        n.on_incident("opened", incident())  # same id, reopened within the hold
        n.on_incident("resolved", incident(resolved_ms=1_009_000))
        assert statuses(n) == [
            ("inc-000001#1.0", "firing"),
            ("inc-000001#1", "resolved"),
            ("inc-000001#2.0", "firing"),
            ("inc-000001#2", "resolved"),
        ]

    def test_api_receiver_pushes_updates_and_always_resolves(self, db: sqlite3.Connection) -> None:
        api = ReceiverConfig(name="am", type="alertmanager_api", url="http://127.0.0.1:1", send_resolved=False)
        n = notifier(db, api)
        n.on_incident("opened", incident())
        n.on_incident("updated", incident(updated_ms=1_000_700, affected_nodes=["node-001", "node-009"]))
        n.on_incident("resolved", incident(resolved_ms=1_002_000))
        assert statuses(n, "am") == [
            ("inc-000001#1.0", "firing"),
            ("inc-000001#1.0@1000700", "firing"),
            ("inc-000001#1", "resolved"),
        ]
        body = json.loads(n.outbox.items("am")[0].payload)
        assert isinstance(body, list) and "endsAt" not in body[0]  # stamped at send time
        assert json.loads(n.outbox.items("am")[2].payload)[0]["endsAt"] == "1970-01-01T00:16:42.000Z"
        assert n.outbox.active("am") == []

    def test_api_active_set_follows_the_incident(self, db: sqlite3.Connection) -> None:
        api = ReceiverConfig(name="am", type="alertmanager_api", url="http://127.0.0.1:1")
        n = notifier(db, api)
        n.on_incident("opened", incident())
        n.on_incident("opened", incident(id="inc-000002"))
        assert [a.incident_id for a in n.outbox.active("am")] == ["inc-000001", "inc-000002"]
        n.on_incident("resolved", incident(resolved_ms=1_001_000))
        assert [a.incident_id for a in n.outbox.active("am")] == ["inc-000002"]

    def test_generic_webhook_body_names_its_delivery(self, db: sqlite3.Connection) -> None:
        gen = ReceiverConfig(name="gen", type="webhook", url="http://127.0.0.1:1", secret="k")
        n = notifier(db, gen)
        n.on_incident("opened", incident())
        (item,) = n.outbox.items("gen")
        body = json.loads(item.payload)
        assert body["delivery_id"] == item.delivery_id and body["incident"]["id"] == "inc-000001"

    def test_backoff_grows_to_the_cap_with_jitter(self, db: sqlite3.Connection) -> None:
        r = hook(backoff=BackoffConfig(initial_s=1, max_s=300, multiplier=2, jitter=0.2))
        n = notifier(db, r)
        delays = [n._backoff_s(r, a, None) for a in range(1, 13)]
        assert 0.8 <= delays[0] <= 1.2 and 1.6 <= delays[1] <= 2.4 and 6.4 <= delays[3] <= 9.6
        assert all(240 <= d <= 360 for d in delays[9:])
        assert n._backoff_s(r, 1, 30.0) == 30.0  # Retry-After wins when longer
