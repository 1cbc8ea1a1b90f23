"""Fail-slow peer groups, kept up to date as nodes report instead of regrouped every evaluation.

Why: the comparison ran ``group_of`` for every node of the fleet every evaluation (5 s); the
pipeline's ``group_of`` asked the job registry per node (every job, every rank) and the fabric
per node, ~20 ms on the controller's event loop at 10,000 nodes even with no job and no fabric
(bench.failslow_step). Here a node is regrouped only when something that decides its group
changed: its job (``Report.job_steps``) was seen or went stale (``job_ttl_s``), it is new or
gone, or the peer map (``group_map``: the registry's jobs and the fabric's blocks, one dict)
differs from the last one (or the wall clock stepped back: a stale job may be fresh again). A
group whose members, windows and window ages did not change keeps its last verdict
(``FailSlowDetector``); ``dirty`` names the groups that must be compared again.

Without ``group_map`` (a plain ``group_of`` callable, which can change its answer any time)
every node is regrouped every evaluation, as before.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Collection, Mapping
from typing import Protocol


class _HasJob(Protocol):
    job: str | None
    job_seen_ms: int


class PeerGroups:
    """Node -> group and group -> members, and which groups changed since they were last compared."""

    def __init__(
        self,
        group_of: Callable[[str], str | None],
        group_map: Callable[[], Mapping[str, str]] | None,
        job_ttl_ms: int,
    ) -> None:
        self._group_of = group_of
        self._group_map = group_map
        self._ttl_ms = job_ttl_ms
        self._last_map: dict[str, str] | None = None
        self._last_now = 0  # the last refresh's time
        self.group: dict[str, str] = {}  # node -> its group (nodes without one are absent)
        self.members: dict[str, dict[str, None]] = {}  # group -> its nodes (an ordered set)
        self.dirty: set[str] = set()  # groups to compare again
        self._pending: set[str] = set()  # nodes to regroup at the next refresh
        self._job_expiry: list[tuple[int, str]] = []  # (job_seen_ms + ttl, node): when a job goes stale
        self._queued: dict[str, int] = {}  # node -> its live entry in _job_expiry (the earliest)

    # -- what the detector tells --------------------------------------------------------

    def added(self, node: str) -> None:
        """A node the detector has not held before."""
        self._pending.add(node)

    def job_seen(self, node: str, job: str, seen_ms: int) -> None:
        """The node's report named its job: regroup it unless it is in that job's group; note when it goes stale."""
        if self.group.get(node) != f"job:{job}":
            self._pending.add(node)
        self._watch(node, seen_ms + self._ttl_ms)

    def _watch(self, node: str, expiry: int) -> None:
        """Look at the node again once ``expiry`` has passed (its job sighting then goes stale)."""
        queued = self._queued.get(node)
        if queued is None or expiry < queued:  # earlier than queued: only after a wall-clock step back
            self._queued[node] = expiry
            heapq.heappush(self._job_expiry, (expiry, node))

    def changed(self, node: str) -> None:
        """The node's samples changed: its group compares again."""
        group = self.group.get(node)
        if group is not None:
            self.dirty.add(group)

    def forget(self, node: str) -> None:
        self._pending.discard(node)
        self._move(node, None)

    # -- refresh ------------------------------------------------------------------------

    def refresh(self, nodes: Mapping[str, _HasJob], now_ms: int) -> int:
        """Bring every node's group up to date at ``now_ms`` (groups that changed turn dirty).

        Returns how many nodes it regrouped (all of them when the peer map changed).
        """
        stepped_back = now_ms < self._last_now  # a wall-clock step: a job gone stale may be fresh again
        self._last_now = now_ms
        if self._group_map is None:
            self._pending.clear()
            return self._regroup(nodes, nodes, now_ms, None)
        peer_map = self._group_map()
        if peer_map != self._last_map or stepped_back:
            self._last_map = dict(peer_map)
            self._pending.clear()
            return self._regroup(nodes, nodes, now_ms, self._last_map)
        todo = self._pending
        self._pending = set()
        todo.update(self._stale_jobs(nodes, now_ms))
        return self._regroup(nodes, todo, now_ms, self._last_map)

    def _stale_jobs(self, nodes: Mapping[str, _HasJob], now_ms: int) -> list[str]:
        """Nodes whose job went stale since the last refresh (their entries re-queue while fresh)."""
        out: list[str] = []
        heap = self._job_expiry
        while heap and heap[0][0] < now_ms:
            queued, node = heapq.heappop(heap)
            if self._queued.get(node) != queued:
                continue  # superseded by an earlier entry, already handled
            del self._queued[node]
            ns = nodes.get(node)
            if ns is None or ns.job is None:
                continue
            expiry = ns.job_seen_ms + self._ttl_ms
            if expiry < now_ms:
                out.append(node)
            else:  # seen again since: still fresh, look again when this sighting goes stale
                self._queued[node] = expiry
                heapq.heappush(heap, (expiry, node))
        return out

    def _regroup(
        self, nodes: Mapping[str, _HasJob], which: Collection[str], now_ms: int, peer_map: Mapping[str, str] | None
    ) -> int:
        ttl = self._ttl_ms
        group_of = self._group_of
        for node in which:
            ns = nodes.get(node)
            if ns is None:
                self._move(node, None)
                continue
            if ns.job is not None and now_ms - ns.job_seen_ms <= ttl:
                group: str | None = f"job:{ns.job}"
                self._watch(node, ns.job_seen_ms + ttl)  # fresh again after a wall-clock step back too
            elif peer_map is not None:
                group = peer_map.get(node)
            else:
                group = group_of(node)
            if self.group.get(node) != group:
                self._move(node, group)
        return len(which)

    def _move(self, node: str, group: str | None) -> None:
        old = self.group.pop(node, None)
        if old is not None:
            members = self.members[old]
            del members[node]
            if not members:
                del self.members[old]
            self.dirty.add(old)
        if group is not None:
            self.group[node] = group
            self.members.setdefault(group, {})[node] = None
            self.dirty.add(group)
