"""The agent_conflict condition: raised by the second foreign takeover in a window, resolved after a quiet one."""

from __future__ import annotations

from controller.detect.agent_conflict import AgentConflicts
from controller.detect.correlation_settings import CorrelationConfig
from controller.detect.fabric_grouping import Grouper
from starpulse.core.clock import FakeClock


def test_one_takeover_is_counted_not_a_conflict() -> None:
    clock = FakeClock()
    conflicts = AgentConflicts(clock, window_s=60)
    assert conflicts.takeover("node-1", "ipv4:10.0.0.1:1", "ipv4:10.0.0.9:2") == []
    assert not conflicts.active("node-1")


def test_second_takeover_in_the_window_opens_then_a_quiet_window_resolves() -> None:
    clock = FakeClock()
    conflicts = AgentConflicts(clock, window_s=60)
    conflicts.takeover("node-1", "a", "b")
    clock.advance(30)
    [opened] = conflicts.takeover("node-1", "b", "a")
    assert opened.kind == "opened"
    assert opened.condition.category == "agent" and opened.condition.node == "node-1"
    assert opened.condition.evidence == {"takeovers": 2, "peers": ["a", "b"]}
    clock.advance(30)
    [updated] = conflicts.takeover("node-1", "a", "b")
    assert updated.kind == "updated" and updated.condition.count == 3
    clock.advance(59)
    assert conflicts.tick() == []  # the last takeover is still inside the window
    clock.advance(2)
    [resolved] = conflicts.tick()
    assert resolved.kind == "resolved" and not conflicts.active("node-1")


def test_takeovers_further_apart_than_the_window_never_conflict() -> None:
    clock = FakeClock()
    conflicts = AgentConflicts(clock, window_s=60)
    for _ in range(5):
        assert conflicts.takeover("node-1", "a", "b") == []
        clock.advance(61)
        conflicts.tick()


def test_conflict_groups_as_its_own_incident_kind() -> None:
    clock = FakeClock()
    conflicts = AgentConflicts(clock, window_s=60)
    conflicts.takeover("node-1", "a", "b")
    [opened] = conflicts.takeover("node-1", "b", "a")
    [group] = Grouper(None, CorrelationConfig()).group([opened.condition])
    assert group.kind == "agent_conflict" and group.nodes == {"node-1"}
