"""Presence kinds: a compute node's agent (heartbeat) or a switch's agent (switch_silent)
not heard from. The registry marks a node unreachable after its heartbeat timeout; back
online, the condition resolves at once."""

from __future__ import annotations

from typing import ClassVar

from controller.detect.evaluators.base import PresenceEvaluator
from controller.detect.model import ComponentType
from controller.ingest.registry import ONLINE, UNREACHABLE, NodeRecord


class _Silent(PresenceEvaluator):
    ctype: ClassVar[ComponentType]

    def presence(self, node: NodeRecord, old: str, new: str, now: int) -> None:
        nid = node.node_id
        for rule in self.rules:
            if new == UNREACHABLE:
                silent_s = round((now - node.last_seen_ms) / 1000, 1) if node.last_seen_ms else None
                msg = f"{nid} not heard from" + (f" for {silent_s}s" if silent_s is not None else "")
                self.judge.bad(
                    rule,
                    nid,
                    self.ctype,
                    None if self.switches else nid,
                    nid,
                    msg,
                    {"previous_state": old, "last_seen_ms": node.last_seen_ms, "silent_s": silent_s},
                    now,
                )
            elif new == ONLINE:
                self.judge.clear(rule, nid, now, reason="online")


class Heartbeat(_Silent):
    """A compute node unreachable (presence)."""

    kind = "heartbeat"
    ctype = "node"


class SwitchSilent(_Silent):
    """A switch's agent unreachable (presence of a switch-role node)."""

    kind = "switch_silent"
    switches = True
    ctype = "switch"
