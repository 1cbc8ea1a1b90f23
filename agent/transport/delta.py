"""Delta reports: send only the NIC counters that changed since the last full report.

A node's 9 NIC ports carry ~1,000 cumulative counters, and in a healthy cluster ~90 % of
them (every error counter) do not move from one report to the next. Those map entries are
most of a report's bytes and most of the controller's decode time and memory, so on a
stream whose controller accepts them (``Welcome.accepts_delta_reports``) the agent sends:

* a full report first, every ``full_every``-th report after, whenever the controller asks
  (``Ack.full_report_needed``), and whenever the counter layout changed (a port or a
  counter appeared or disappeared: a delta cannot say "gone");
* in between, the report with ``counters_delta`` set and each port's counter maps holding
  only the entries that differ from the last full report. Deltas are against the last
  full report, not the previous report, so one lost report never loses a change.

Everything else in the report (GPU samples, link state, host, events) is always complete.
"""

from __future__ import annotations

from starpulse.v1 import telemetry_pb2 as tpb

MAPS = ("counters", "hw_counters", "netdev_stats", "ethtool_stats")

_Base = dict[tuple[str, int], tuple[dict[str, int], ...]]


class ReportDelta:
    """Per-stream delta encoder; ``reset`` on every new stream."""

    def __init__(self, full_every: int = 12) -> None:
        if full_every < 1:
            raise ValueError("full_every must be >= 1")
        self.full_every = full_every
        self.enabled = False
        self._base: _Base | None = None
        self._since_full = 0
        self.full_sent = 0
        self.delta_sent = 0

    def reset(self, enabled: bool) -> None:
        """A new stream: the next report is full; deltas only if the controller accepts them."""
        self.enabled = enabled
        self._base = None
        self._since_full = 0

    def force_full(self) -> None:
        """The controller lost track (it asked): the next report is full."""
        self._base = None

    def encode(self, report: tpb.Report) -> tpb.Report:
        """The report to send: ``report`` itself (full) or a delta copy of it."""
        if not self.enabled:
            return report
        base = self._base
        if base is not None and self._since_full < self.full_every - 1:
            delta = self._delta(report, base)
            if delta is not None:
                self._since_full += 1
                self.delta_sent += 1
                return delta
        self._base = {(nic.rdma_device, nic.port): tuple(dict(getattr(nic, m)) for m in MAPS) for nic in report.nics}
        self._since_full = 0
        self.full_sent += 1
        return report

    @staticmethod
    def _delta(report: tpb.Report, base: _Base) -> tpb.Report | None:
        """A copy of the report without the unchanged counters; None when the layout changed."""
        if len(report.nics) != len(base):
            return None
        out = tpb.Report()
        out.CopyFrom(report)
        out.counters_delta = True
        for nic in out.nics:
            maps = base.get((nic.rdma_device, nic.port))
            if maps is None:
                return None
            for name, was in zip(MAPS, maps, strict=True):
                current = getattr(nic, name)
                now = dict(current)  # one pass over the map; then clear and re-add the few that moved
                if now.keys() != was.keys():
                    return None  # a counter appeared or disappeared: layout changed
                changed = [(k, v) for k, v in now.items() if was[k] != v]
                current.clear()
                for k, v in changed:
                    current[k] = v
        return out
