"""Delta reports: send only the NIC counters and NVLinks that changed since the last full report.

A node's 9 NIC ports carry ~1,000 cumulative counters, and in a healthy cluster ~90 % of
them (every error counter) do not move from one report to the next; its 8 GPUs carry 144
NVLink records (state and error counters) that almost never change. Those are most of a
report's bytes and most of the controller's decode and detection time, so on a stream
whose controller accepts them (``Welcome.accepts_delta_reports``) the agent sends:

* a full report first, every ``full_every``-th report after, whenever the controller asks
  (``Ack.full_report_needed``), and whenever the layout changed (a port or a counter, a
  GPU or one of its NVLinks appeared or disappeared: a delta cannot say "gone");
* in between, the report with ``counters_delta`` set, each port's counter maps holding
  only the entries that differ from the last full report and each GPU's ``nvlinks`` only
  the links whose record (state, any counter, a counter's presence) differs from that
  GPU's link in the last full report. Deltas are against the last full report, not the
  previous report, so one lost report never loses a change: a link that went down after
  the full report is in every delta until the next full report.

Everything else in the report (the rest of each GPU sample, port state, host, events) is
always complete.
"""

from __future__ import annotations

from itertools import compress
from operator import ne

from starpulse.core.linkrecords import link_records
from starpulse.v1 import telemetry_pb2 as tpb

MAPS = ("counters", "hw_counters", "netdev_stats", "ethtool_stats")

# One port's counter maps in the last full report: (keys, values) per map, in MAPS order.
# Lists, not dicts: a delta reads the current values of the base's keys in one C-level
# map() over the protobuf map and compares the two lists in C, instead of building a
# Python dict of every entry (~1,000 per report) through the Mapping ABC.
_PortBase = tuple[tuple[list[str], list[int]], ...]
_Base = dict[tuple[str, int], _PortBase]
# Each GPU of the last full report, in report order: (index, its NVLink records serialized).
# The records come out of the GPU sample in C (starpulse.core.linkrecords: no Python object per
# link) and a GPU's are compared in one C-level list compare; a record's bytes differ when
# any field, or a counter's presence, differs.
_GpuBase = list[tuple[int, list[bytes]]]


class ReportDelta:
    """Per-stream delta encoder; ``reset`` on every new stream."""

    def __init__(self, full_every: int = 12) -> None:
        if full_every < 1:
            raise ValueError("full_every must be >= 1")
        self.full_every = full_every
        self.enabled = False
        self._base: _Base | None = None
        self._gpu_base: _GpuBase = []
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
        out = tpb.Report()
        return out if self.encode_into(report, out) else report

    def encode_into(self, report: tpb.Report, out: tpb.Report) -> bool:
        """Write the report to send into ``out`` (e.g. an AgentMessage's ``report``); True if a delta.

        One copy of the report either way: the link builds its message around ``out`` instead
        of copying a finished report into a new AgentMessage.
        """
        out.CopyFrom(report)
        if not self.enabled:
            return False
        base = self._base
        if base is not None and self._since_full < self.full_every - 1:
            if self._strip(out, base) and self._strip_links(out, self._gpu_base):
                self._since_full += 1
                self.delta_sent += 1
                return True
            out.CopyFrom(report)  # the layout changed part-way: send it whole
        self._base = {(nic.rdma_device, nic.port): _port_base(nic) for nic in report.nics}
        self._gpu_base = [(g.index, list(link_records(g))) for g in report.gpus]
        self._since_full = 0
        self.full_sent += 1
        return False

    @staticmethod
    def _strip(out: tpb.Report, base: _Base) -> bool:
        """Drop the counters equal to the base's from ``out``; False when the layout changed."""
        if len(out.nics) != len(base):
            return False
        out.counters_delta = True
        for nic in out.nics:
            maps = base.get((nic.rdma_device, nic.port))
            if maps is None:
                return False
            for name, (keys, was) in zip(MAPS, maps, strict=True):
                current = getattr(nic, name)
                size = len(current)
                if size != len(keys):
                    return False  # a counter appeared or disappeared: layout changed
                now = list(map(current.__getitem__, keys))
                if len(current) != size:
                    return False  # a base key was missing (reading it inserted a zero): layout changed
                if now == was:
                    current.clear()
                    continue
                moved = list(map(ne, now, was))
                current.clear()
                for k, v in zip(compress(keys, moved), compress(now, moved), strict=True):
                    current[k] = v
        return True

    @staticmethod
    def _strip_links(out: tpb.Report, base: _GpuBase) -> bool:
        """Drop the NVLinks equal to the base's from ``out``; False when a GPU or a link came or went."""
        gpus = out.gpus
        if len(gpus) != len(base):
            return False
        for g, (index, was) in zip(gpus, base, strict=True):
            if g.index != index:
                return False
            now = link_records(g)
            if now == was:
                if was:
                    g.ClearField("nvlinks")
                continue
            if len(now) != len(was):
                return False  # a link appeared or disappeared: layout changed
            moved = list(map(ne, now, was))
            sent = list(compress(now, moved))
            if list(map(_link_number, sent)) != list(map(_link_number, compress(was, moved))):
                return False  # a link renumbered: layout changed
            g.ClearField("nvlinks")
            links = g.nvlinks
            for record in sent:  # the changed links whole, in report order
                links.add().MergeFromString(record)
        return True


def _link_number(record: bytes) -> int:
    return tpb.NvLinkSample.FromString(record).link


def _port_base(nic: tpb.NicSample) -> _PortBase:
    out = []
    for name in MAPS:
        current = getattr(nic, name)
        keys = list(current)
        out.append((keys, list(map(current.__getitem__, keys))))
    return tuple(out)
