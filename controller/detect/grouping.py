"""How long a new condition waits before it is grouped: only as long as it buys something.

Waiting is for siblings. A condition that no component shared between nodes could explain
(a GPU's Xid, a lost GPU, a DBE, a disk, a straggler) has no siblings on other nodes; its
only possible siblings are the same node's other devices (a shared PCIe switch, a power
fault), and those arrive together, in one batch of the node's events: it waits
``node_window_s``. A condition that a shared component could explain (a NIC port down or
erroring, a switch port, a switch, a lost heartbeat) waits as long as its siblings on other
nodes take to arrive, which depends on how they are observed:

- seen in reports (link state, error rates): every sibling's next report is at most one
  report interval away, so the window is the siblings' report interval (as measured from
  their reports, not configured) plus ``sibling_slack_s`` for transit and decision;
- raised by an event (a port's state change, which the agents' link watches send at once):
  the siblings' events are as quick, so the window is ``event_window_s``;
- a lost heartbeat: siblings' last reports were spread over one report interval, and the
  heartbeat sweep notices each within one sweep, so the interval plus the sweep (plus slack).

``settle_s`` (CorrelationConfig) stays the longest any condition waits, and the window when
the siblings' cadence is not known yet (no two reports seen).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Protocol

from controller.detect.model import Condition

Key = tuple[str, str]

# Categories (controller.detect.model.CATEGORIES) no component shared between nodes explains.
NODE_LOCAL = frozenset({"gpu", "host", "failslow", "agent", "hang"})  # a hang: decided job-wide already
# Seen only through the heartbeat sweep.
PRESENCE = frozenset({"heartbeat"})


def is_node_local(condition: Condition) -> bool:
    """True when only the condition's own node can be its cause (its siblings are that node's devices)."""
    return condition.category in NODE_LOCAL


def ripe_batch(pending: Mapping[Key, int], conds: Mapping[Key, Condition], now_ms: int) -> list[Key]:
    """The pending conditions to group now (name order): those whose window closed, and their siblings.

    A shared-component condition brings every pending shared-component condition (a leaf's
    NICs that reported after the first one are its siblings, and grouped apart they would open
    NIC incidents to be merged away); a node-local one brings its own node's node-local ones.
    The rest keep waiting for their own windows.
    """
    ripe = [k for k, due in pending.items() if due <= now_ms]
    if not ripe:
        return []
    shared = any(not is_node_local(conds[k]) for k in ripe)
    nodes = {conds[k].node for k in ripe if is_node_local(conds[k])}
    take = set(ripe)
    for k in pending:
        c = conds[k]
        if (c.node in nodes) if is_node_local(c) else shared:
            take.add(k)
    return sorted(take)


# Incidents about one node's own device or link: an old one has no part in a new fabric fault.
_ONE_NODE_KINDS = frozenset({"gpu_fault", "nic_fault", "node_fault", "link_fault", "host_fault", "straggler"})


def standing_apart(
    incidents: Mapping[str, tuple[str, Iterable[Key]]],
    conds: Mapping[Key, Condition],
    batch: Iterable[Key],
    window_ms: Callable[[Condition], int],
) -> set[str]:
    """Open one-node incidents that began too long before ``batch`` to share its cause.

    ``incidents``: id -> (kind, member keys). Two NIC faults on one leaf minutes apart are two
    faults: the leaf is blamed when its nodes fail together, within one grouping window, so an
    incident whose every condition began more than a window before the batch's first is left
    as it is instead of being regrouped with it (and merged under a switch), unless the batch
    has news from the incident's own node. Fabric-wide
    incidents (switch, partition) stay in the regrouping: they grow as more of it fails.
    """
    fresh = [conds[k] for k in batch if k in conds]
    if not fresh:
        return set()
    cutoff = min(c.first_seen_ms for c in fresh) - max(window_ms(c) for c in fresh)
    batch_nodes = {c.node for c in fresh}
    apart = set()
    for iid, (kind, members) in incidents.items():
        if kind not in _ONE_NODE_KINDS:
            continue
        mine = [conds[k] for k in members if k in conds]
        if any(c.node in batch_nodes for c in mine):
            continue  # news from the incident's own node joins it (or grows it into a node fault)
        if all(c.first_seen_ms < cutoff for c in mine):
            apart.add(iid)
    return apart


class ReportCadence:
    """The fleet's report interval, measured from report timestamps (agents may each keep their own).

    ``saw`` is on the per-report path: one dictionary update. ``interval_s`` (asked only when a
    shared-component condition arrives) takes a high quantile of the nodes' last gaps, so that
    the slowest ordinary reporter bounds the window while one node's reconnect gap does not.
    """

    QUANTILE = 0.95

    def __init__(self, now: Callable[[], float], cache_s: float = 1.0) -> None:
        """``now``: the monotonic clock the cached interval expires on (the injected clock's)."""
        self._last: dict[str, int] = {}  # node -> last report timestamp (ms, agent clock)
        self._gap: dict[str, int] = {}  # node -> ms between its last two reports
        self._cache_s = cache_s
        self._now = now
        self._cached: tuple[float, float | None] = (float("-inf"), None)

    def saw(self, node: str, timestamp_ms: int) -> None:
        last = self._last.get(node)
        if last is not None and timestamp_ms > last:
            self._gap[node] = timestamp_ms - last
        self._last[node] = timestamp_ms

    def forget(self, node: str) -> None:
        self._last.pop(node, None)
        self._gap.pop(node, None)

    def interval_s(self) -> float | None:
        """Seconds between one node's reports, for (nearly) every node; None before any gap is seen."""
        at, value = self._cached
        now = self._now()
        if now - at < self._cache_s:
            return value
        gaps = sorted(self._gap.values())
        value = gaps[min(len(gaps) - 1, int(len(gaps) * self.QUANTILE))] / 1000 if gaps else None
        self._cached = (now, value)
        return value


class WindowSettings(Protocol):
    """The CorrelationConfig fields the windows read (at each condition: a changed setting applies at once)."""

    settle_s: float
    node_window_s: float
    sibling_slack_s: float
    event_window_s: float


class GroupingWindows:
    """Milliseconds a new condition waits for its siblings (see the module docstring)."""

    def __init__(
        self,
        settings: WindowSettings,
        report_interval_s: Callable[[], float | None] = lambda: None,
        sweep_s: float = 1.0,
    ) -> None:
        self.settings = settings
        self._interval = report_interval_s
        self.sweep_s = sweep_s
        # Conditions just raised by an event (detection marks them before the correlator asks).
        self.by_event: set[Key] = set()

    def window_s(self, condition: Condition) -> float:
        cfg = self.settings
        by_event = condition.key in self.by_event
        self.by_event.discard(condition.key)  # asked once, when the condition starts waiting
        if is_node_local(condition):
            return min(cfg.node_window_s, cfg.settle_s)
        if by_event and condition.category not in PRESENCE:
            return min(cfg.event_window_s, cfg.settle_s)
        interval = self._interval()
        if interval is None:
            return cfg.settle_s
        wait = interval + cfg.sibling_slack_s
        if condition.category in PRESENCE:
            wait += self.sweep_s
        return min(wait, cfg.settle_s)

    def window_ms(self, condition: Condition) -> int:
        return int(self.window_s(condition) * 1000)
