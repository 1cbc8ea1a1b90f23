"""A report as detection reads it: a delta report laid over the node's last full report.

A delta report (``Report.counters_delta``, agent.transport.delta) carries in each NIC
counter map only the entries that changed since the last full report on the stream, and
in each GPU only the NVLinks whose record changed; everything absent is as in that full
report. The engine asks this view, once per component and report, for a NIC port's
watched counters and a GPU's links *as of this report*, so no evaluator ever sees a delta:

- ``links(comp, g)``: the GPU's ``Links`` (controller.detect.nvlinks). A full report's
  become the base, read only when they differ from the last full report's (``links_key``,
  in C); a delta's are laid over the base, and a delta GPU without links *is* the base (no
  link is read: the healthy case).
- ``nic_counters(comp, s)``: the watched counters' values, in ``names`` order. A full
  report's become the base; a delta's absent entries are the base's, and a delta whose
  maps carry none of the watched counters (a healthy port's delta holds only traffic
  counters) is the base itself after one key scan per map.

The view holds one base per GPU and per port; ``forget`` drops a node's.
"""

from __future__ import annotations

from collections.abc import Callable
from operator import attrgetter
from typing import Any

from controller.detect.linkkey import links_key
from controller.detect.nvlinks import Links, from_rows, overlay
from starpulse.v1 import telemetry_pb2 as tpb


class ReportView:
    """The bases of one engine's nodes, and which kind of report is being read now."""

    def __init__(self, nic_counters: tuple[str, ...] = (), link_counters: tuple[str, ...] = ()) -> None:
        """``nic_counters``: "source/counter" entries the rules read; ``link_counters``: the
        NvLinkSample counters they read (each link's slice of ``Links.values``)."""
        sources: dict[str, list[str]] = {}
        for key in dict.fromkeys(nic_counters):
            source, _, counter = key.partition("/")
            sources.setdefault(source, []).append(counter)
        self._nic_sources = tuple((src, tuple(cs)) for src, cs in sources.items())
        self.nic_names = tuple(f"{src}/{c}" for src, cs in self._nic_sources for c in cs)
        self._nic_watched = tuple(frozenset(cs) for _, cs in self._nic_sources)
        self._nic_maps = tuple_getter(*(src for src, _ in self._nic_sources))  # one C-level read of the maps
        self.link_counters = tuple(dict.fromkeys(link_counters))
        self._link_row = attrgetter("link", "up", *self.link_counters)  # (link, up, *counters): one read a link
        self._width = len(self.link_counters)
        self.link_base: dict[str, Links] = {}  # GPU -> its links in its last full report
        self.nic_base: dict[str, tuple[int | None, ...]] = {}  # port -> its watched counters in its last full report
        # True while a full report is read: it is the base, so every port's counters are read
        # into it, due or not (the engine asks; evaluators never see it).
        self.full = True

    def begin(self, report: tpb.Report) -> None:
        """Read ``report`` next (once per report, before any component of it)."""
        self.full = not report.counters_delta

    def links(self, comp: str, g: tpb.GpuSample) -> Links | None:
        """The GPU's links as of this report (None: it has none, or a delta before any full report has none)."""
        links = g.nvlinks
        base = self.link_base.get(comp)
        if not self.full:
            if base is not None:
                if not links:
                    return base
                rows = list(map(self._link_row, links))
                # None: a link the base lacks; only an agent from before NVLink deltas sends a link
                # set other than the full report's, and it sends every link: take them as they are.
                return overlay(base, rows) or from_rows(b"", rows, self._width)
            if not links:
                return None
            # no full report seen on this stream yet: what is there is all there is
            return from_rows(b"", list(map(self._link_row, links)), self._width)
        if not links:
            self.link_base.pop(comp, None)
            return None
        key = links_key(g)
        if base is not None and base.key == key:
            return base  # the same records as the last full report: nothing to read again
        base = from_rows(key, list(map(self._link_row, links)), self._width)
        self.link_base[comp] = base
        return base

    def nic_counters(self, comp: str, s: tpb.NicSample) -> tuple[int | None, ...]:
        """The port's watched counters as of this report (None: not in the report, nor in its base)."""
        if self.full:
            values = self._nic_values(s)
            self.nic_base[comp] = values  # every full report: the base later deltas omit
            return values
        base = self.nic_base.get(comp)
        if base is not None and self._nic_untouched(s):
            return base  # what the merge below gives when no watched counter is in the delta
        values = self._nic_values(s)
        if base is not None and None in values:
            values = tuple([b if v is None else v for v, b in zip(values, base, strict=True)])
        return values

    def forget(self, node_id: str) -> None:
        """Drop a node's bases (it left)."""
        for entity in [e for e in self.link_base if e.startswith(f"{node_id}/")]:
            del self.link_base[entity]
        for entity in [e for e in self.nic_base if e.startswith((f"{node_id}/", f"{node_id}:"))]:
            del self.nic_base[entity]

    def _nic_untouched(self, s: tpb.NicSample) -> bool:
        """True when a delta report carries none of the watched counters for this port.

        A healthy port's delta holds only its traffic counters, so this is the common case:
        one C-level key scan per map instead of a lookup per watched counter.
        """
        for m, watched in zip(self._nic_maps(s), self._nic_watched, strict=True):
            if m and not watched.isdisjoint(m):
                return False
        return True

    def _nic_values(self, s: tpb.NicSample) -> tuple[int | None, ...]:
        values: list[int | None] = []
        for m, (_, counters) in zip(self._nic_maps(s), self._nic_sources, strict=True):
            values.extend(map(m.get, counters))
        return tuple(values)


def tuple_getter(*names: str) -> Callable[[Any], tuple[Any, ...]]:
    """attrgetter that always returns a tuple (attrgetter of one name returns the bare value)."""
    if len(names) > 1:
        return attrgetter(*names)
    if names:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return lambda obj: ()
