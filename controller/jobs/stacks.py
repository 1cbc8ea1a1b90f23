"""Who stalled a hung job: its ranks grouped by where they wait, the odd ones named.

On a hang every healthy rank waits in the same place (the same collective, reached through
the same Python frames), and the rank that stalled them is somewhere else: spinning in a data
loader, stuck in I/O, in another collective. The ranks' stacks (``py-spy dump`` on each node,
``agent.stacks``) are normalised (function and file name, no line numbers and no paths, so two
ranks at the same place in different checkouts or lines of one loop match) and grouped, with
the last collective each rank entered (NCCL flight recorder) where the job records it. The
largest group is the waiters; the ranks outside it are the outliers, named with their node.
One group: every rank waits in the same place and no rank is named. Two groups of the same
size: the stacks cannot say which side waits, and no rank is named either.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from controller.detect.model import Incident

# Frames that say nothing about where the program is (the interpreter's entry, runpy, threading).
_NOISE = frozenset({"<module>", "_run_code", "_run_module_as_main", "run", "_bootstrap", "_bootstrap_inner"})


@dataclass(frozen=True)
class RankStack:
    """One rank's answer from its node's agent."""

    rank: int
    node: str
    pid: int
    frames: tuple[str, ...]  # normalised, innermost first
    last_collective: str = ""  # "nccl:all_reduce#42" from the flight recorder; "" unknown
    error: str = ""

    @property
    def key(self) -> tuple[tuple[str, ...], str]:
        return (self.frames, self.last_collective)


@dataclass
class StackVerdict:
    """The groups (outliers first in ``to_evidence``), the waiters' group and the ranks named."""

    groups: list[list[RankStack]]
    waiters: list[RankStack] = field(default_factory=list)
    outliers: list[RankStack] = field(default_factory=list)
    reason: str = ""
    unread: list[RankStack] = field(default_factory=list)  # ranks whose stack could not be read
    at_ms: int = 0  # when the controller had them grouped (its clock)
    hardware: list[dict[str, Any]] = field(default_factory=list)  # open incidents on the named nodes

    def to_evidence(self) -> dict[str, Any]:
        def group(members: list[RankStack], role: str) -> dict[str, Any]:
            first = members[0]
            return {
                "role": role,
                "ranks": [m.rank for m in members],
                "nodes": sorted({m.node for m in members}),
                "frames": list(first.frames[:12]),
                "last_collective": first.last_collective,
            }

        waiting = {id(m) for m in self.waiters}
        ordered = sorted(self.groups, key=lambda g: (id(g[0]) in waiting, len(g)))
        return {
            "groups": [group(g, "waiters" if id(g[0]) in waiting else "outlier") for g in ordered],
            "outliers": [{"rank": o.rank, "node": o.node, "pid": o.pid} for o in self.outliers],
            "reason": self.reason,
            "unread": [{"rank": u.rank, "node": u.node, "error": u.error} for u in self.unread],
            "hardware": self.hardware,
        }


def normalise(frames: list[dict[str, Any]]) -> tuple[str, ...]:
    """``name (file)`` per frame, innermost first, without line numbers, paths or entry frames."""
    out = []
    for f in frames:
        name = str(f.get("name", ""))
        if not name or name in _NOISE:
            continue
        path = str(f.get("file") or "")
        out.append(f"{name} ({path.rsplit('/', 1)[-1]})" if path else name)
    return tuple(out)


def rank_stacks(node: str, payload: dict[str, Any]) -> list[RankStack]:
    """One node's COLLECT_STACKS payload as RankStacks (what ``agent.stacks`` answers)."""
    out = []
    for r in payload.get("ranks") or []:
        if not isinstance(r, dict):
            continue
        lc = r.get("last_collective") or {}
        last = f"{lc.get('profiling_name', '')}#{lc.get('collective_seq_id')}" if isinstance(lc, dict) and lc else ""
        out.append(
            RankStack(
                rank=int(r.get("rank", -1)),
                node=node,
                pid=int(r.get("pid", 0)),
                frames=normalise([f for f in r.get("frames") or [] if isinstance(f, dict)]),
                last_collective=last,
                error=str(r.get("error", "")),
            )
        )
    return out


def hardware_on(nodes: set[str], incidents: list[Incident]) -> list[dict[str, Any]]:
    """Open incidents on the named nodes (an Xid, a NIC flap, a slow GPU, a straggler): the
    hardware's word on why a rank there stopped, joined to the hang's evidence."""
    return [
        {"id": i.id, "kind": i.kind, "root_cause": i.root_cause, "opened_ms": i.opened_ms}
        for i in incidents
        if i.kind != "job_hang" and set(i.affected_nodes) & nodes
    ]


def group_stacks(stacks: list[RankStack]) -> StackVerdict:
    """Group by (frames, last collective); the largest group waits, the rest are named."""
    read = [s for s in stacks if s.frames]
    unread = [s for s in stacks if not s.frames]
    by_key: dict[tuple[tuple[str, ...], str], list[RankStack]] = defaultdict(list)
    for s in sorted(read, key=lambda s: s.rank):
        by_key[s.key].append(s)
    groups = sorted(by_key.values(), key=lambda g: (-len(g), g[0].rank))
    if not groups:
        return StackVerdict([], reason="no stack could be read", unread=unread)
    if len(groups) == 1:
        return StackVerdict(
            groups, waiters=groups[0], reason="every rank waits in the same place: no rank named", unread=unread
        )
    if len(groups[0]) == len(groups[1]):
        return StackVerdict(groups, reason="no group is larger than the others: no rank named", unread=unread)
    outliers = [s for g in groups[1:] for s in g]
    named = ", ".join(f"rank {o.rank} on {o.node}" for o in outliers[:8])
    return StackVerdict(
        groups,
        waiters=groups[0],
        outliers=outliers,
        reason=f"{len(groups[0])} rank(s) wait in one place; not there: {named}",
        unread=unread,
    )
