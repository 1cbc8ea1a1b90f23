"""Two agents claiming one node: an ``agent_conflict`` condition, raised from stream takeovers.

Ingest lets the newest stream for a node win and tells the replaced one (ABORTED), whose
agent comes back after its backoff. One foreign takeover (another buffer epoch, not the
agent's own reconnect) is logged and counted; a second within ``window_s`` means both
claimants are alive and keep displacing each other: the node's telemetry is no longer
trustworthy (whose reports are these?) and a person must look. The condition resolves when
no takeover happened for a whole window. Times come from the injected clock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from controller.detect.model import Condition, ConditionChange
from starpulse.core.clock import Clock
from starpulse.core.vocab import ACTION_INVESTIGATE

RULE = "agent.conflict"
CATEGORY = "agent"
TAKEOVERS_FOR_CONFLICT = 2


@dataclass
class _Node:
    times_ms: deque[int] = field(default_factory=deque)
    peers: list[str] = field(default_factory=list)
    condition: Condition | None = None


class AgentConflicts:
    """Foreign stream takeovers per node, as ``agent_conflict`` condition changes."""

    def __init__(self, clock: Clock, window_s: float = 300.0) -> None:
        self._clock = clock
        self._window_ms = int(window_s * 1000)
        self._nodes: dict[str, _Node] = {}

    def takeover(self, node: str, old_peer: str, new_peer: str) -> list[ConditionChange]:
        """A foreign stream replaced ``node``'s live one: the change to feed, if any."""
        now = self._clock.time_ms()
        state = self._nodes.setdefault(node, _Node())
        state.times_ms.append(now)
        while state.times_ms and state.times_ms[0] < now - self._window_ms:
            state.times_ms.popleft()
        for peer in (old_peer, new_peer):
            if peer and peer not in state.peers:
                state.peers = [*state.peers, peer][-8:]  # the latest few, for the evidence
        count = len(state.times_ms)
        if state.condition is not None:
            state.condition.last_seen_ms = now
            state.condition.count = count
            state.condition.evidence = self._evidence(state)
            return [ConditionChange("updated", state.condition)]
        if count < TAKEOVERS_FOR_CONFLICT:
            return []
        state.condition = Condition(
            rule=RULE,
            component=node,
            component_type="node",
            category=CATEGORY,
            node=node,
            severity="critical",
            action=ACTION_INVESTIGATE,
            message=(
                f"two agents claim {node}: its stream was taken over {count} times in"
                f" {self._window_ms // 1000} s (peers {', '.join(state.peers)})"
            ),
            first_seen_ms=now,
            last_seen_ms=now,
            count=count,
            evidence=self._evidence(state),
        )
        return [ConditionChange("opened", state.condition)]

    def tick(self) -> list[ConditionChange]:
        """Resolve the conflicts with no takeover for a whole window."""
        now = self._clock.time_ms()
        changes: list[ConditionChange] = []
        for node, state in list(self._nodes.items()):
            if state.times_ms and state.times_ms[-1] >= now - self._window_ms:
                continue
            if state.condition is not None:
                state.condition.resolved_ms = now
                changes.append(ConditionChange("resolved", state.condition))
            del self._nodes[node]
        return changes

    def active(self, node: str) -> bool:
        state = self._nodes.get(node)
        return state is not None and state.condition is not None

    @staticmethod
    def _evidence(state: _Node) -> dict[str, object]:
        return {"takeovers": len(state.times_ms), "peers": list(state.peers)}
