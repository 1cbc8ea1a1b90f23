"""Rates from raw cumulative counters, as agents send them.

Agents ship counters as read (so a lost report loses nothing); the controller turns
successive (timestamp, value) pairs into deltas and rates here. Three things make that
harder than a subtraction:

- a value that goes *down* is a reset (driver reload, ``perfquery -x``): the new value
  is the count since the reset, never a negative or a 2**64-sized delta;
- IBA PortCounters are 4/8/16-bit and *saturate* instead of wrapping: a counter stuck at
  its maximum hides how many errors happen now, so it is flagged ``saturated`` for rules
  to report "at least" rather than a reassuring rate of 0;
- windows ("3 link_downed in 10 minutes") need the recent non-zero deltas, kept bounded.

The hot path is a dict lookup and a few integer operations per counter.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import structlog

log = structlog.get_logger(__name__)

U4 = 0xF
U8 = 0xFF
U16 = 0xFFFF
U32 = 0xFFFF_FFFF
U64 = 0xFFFF_FFFF_FFFF_FFFF

# Saturation value by counter name (the name without its source prefix). IBA PortCounters
# widths from the IBA spec (sysfs `ports/<n>/counters/`); the 32-bit data counters are the
# non-extended PMA ones. Anything not listed is a 64-bit driver counter.
SATURATION: dict[str, int] = {
    "symbol_error": U16,
    "link_error_recovery": U8,
    "link_downed": U8,
    "port_rcv_errors": U16,
    "port_rcv_remote_physical_errors": U16,
    "port_rcv_switch_relay_errors": U16,
    "port_xmit_discards": U16,
    "port_xmit_constraint_errors": U8,
    "port_rcv_constraint_errors": U8,
    "local_link_integrity_errors": U4,
    "excessive_buffer_overrun_errors": U4,
    "VL15_dropped": U16,
    "port_xmit_wait": U32,
}
DEFAULT_SATURATION = U64

DEFAULT_MAX_COUNTERS_PER_ENTITY = 512
DEFAULT_MAX_WINDOW_ENTRIES = 256


@dataclass(slots=True)
class RateSample:
    """What one new counter value means, relative to the previous one."""

    value: int
    delta: int  # increase since the previous sample; >= 0
    interval_s: float
    rate: float  # delta / interval_s, per second
    reset: bool  # the value went down: delta is the count since the reset
    saturated: bool  # the value sits at the counter's maximum: delta and rate are lower bounds


@dataclass(slots=True)
class _Track:
    ts_ms: int
    value: int
    saturation: int
    window: deque[tuple[int, int, bool]] | None = None  # (stamp_ms, delta, saturated), non-zero only
    saturated: bool = False


@dataclass(slots=True)
class _Group:
    """Counters sampled together, stored as tuples: no Python object per counter.

    ``values`` holds the last value seen of every counter (None: never seen); windows exist
    only for counters that ever moved or saturated, so a quiet counter costs one tuple slot.
    """

    names: tuple[str, ...]
    values: tuple[int | None, ...]
    ts_ms: int
    saturated: bool
    sats: tuple[int, ...]  # saturation value per counter
    index: dict[str, int]  # name -> position (shared by groups with the same names)
    windows: dict[str, deque[tuple[int, int, bool]]] | None = None


class GroupSamples(Mapping[str, RateSample]):
    """The samples of one group update, by counter name, built lazily.

    Every counter present now and before has a sample (delta 0 included); building them
    all eagerly would cost an object per counter per update for the few that rules read.
    """

    __slots__ = ("_group", "_interval_s", "_new", "_prev")

    def __init__(
        self, group: _Group, prev: tuple[int | None, ...], new: tuple[int | None, ...], interval_s: float
    ) -> None:
        self._group = group
        self._prev = prev
        self._new = new
        self._interval_s = interval_s

    def __getitem__(self, name: str) -> RateSample:
        i = self._group.index.get(name)
        if i is None:
            raise KeyError(name)
        value, prev = self._new[i], self._prev[i]
        if value is None or prev is None:
            raise KeyError(name)
        reset = value < prev
        delta = value if reset else value - prev
        saturated = value >= self._group.sats[i]
        return RateSample(value, delta, self._interval_s, delta / self._interval_s, reset, saturated)

    def __iter__(self) -> Iterator[str]:
        for name, value, prev in zip(self._group.names, self._new, self._prev, strict=True):
            if value is not None and prev is not None:
                yield name

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _root(entity: str) -> str:
    """The node (or switch) an entity belongs to: 'node-003/nic-5' -> 'node-003'."""
    cut = len(entity)
    for sep in ("/", ":", "<->"):
        i = entity.find(sep)
        if 0 <= i < cut:
            cut = i
    return entity[:cut]


class CounterRate:
    """Per (entity, counter) delta tracking with reset and saturation handling.

    ``entity`` is any stable name (the fabric name of a NIC, "node-003/gpu-1/nvlink-2");
    everything under a node is forgotten with ``forget("node-003")``. Memory is bounded:
    at most ``max_counters_per_entity`` counters per entity and ``max_window_entries``
    non-zero deltas per counter, older than ``retain_s`` dropped.
    """

    def __init__(
        self,
        saturation: Mapping[str, int] | None = None,
        default_saturation: int = DEFAULT_SATURATION,
        retain_s: float = 3600.0,
        max_counters_per_entity: int = DEFAULT_MAX_COUNTERS_PER_ENTITY,
        max_window_entries: int = DEFAULT_MAX_WINDOW_ENTRIES,
    ) -> None:
        self.saturation = dict(SATURATION if saturation is None else saturation)
        self.default_saturation = default_saturation
        self.retain_ms = int(retain_s * 1000)
        self.max_counters_per_entity = max_counters_per_entity
        self.max_window_entries = max_window_entries
        self._tracks: dict[str, dict[str, _Track]] = {}
        self._by_root: dict[str, set[str]] = {}
        self._overflow_logged: set[str] = set()
        self._groups: dict[str, _Group] = {}
        self._layouts: dict[tuple[str, ...], tuple[tuple[int, ...], dict[str, int]]] = {}

    def saturation_of(self, counter: str) -> int:
        """Saturation value of a counter, by its bare name ('hw_counters/x' -> 'x')."""
        name = counter.rsplit("/", 1)[-1]
        return self.saturation.get(name, self.default_saturation)

    def update(self, entity: str, counter: str, ts_ms: int, value: int, now_ms: int | None = None) -> RateSample | None:
        """Record a value; the sample relative to the previous one, None for the first.

        ``ts_ms`` is the sampling time (the agent's clock) and sets the rate's interval;
        ``now_ms`` (default ``ts_ms``) stamps the delta for window sums, so windows can be
        read against the controller's clock. A timestamp that does not advance re-bases
        the counter without a sample (duplicate report, agent clock stepped back).
        """
        tracks = self._tracks.get(entity)
        if tracks is None:
            tracks = self._tracks[entity] = {}
            self._by_root.setdefault(_root(entity), set()).add(entity)
        track = tracks.get(counter)
        if track is None:
            if len(tracks) >= self.max_counters_per_entity:
                if entity not in self._overflow_logged:
                    self._overflow_logged.add(entity)
                    log.warning("counter_rate_entity_full", entity=entity, limit=self.max_counters_per_entity)
                return None
            sat = self.saturation_of(counter)
            tracks[counter] = _Track(ts_ms, value, sat, saturated=value >= sat)
            return None
        elapsed_ms = ts_ms - track.ts_ms
        if elapsed_ms <= 0:
            track.ts_ms, track.value = ts_ms, value
            return None
        prev = track.value
        reset = value < prev
        delta = value if reset else value - prev
        saturated = value >= track.saturation
        track.ts_ms, track.value, track.saturated = ts_ms, value, saturated
        if delta or saturated:
            stamp = ts_ms if now_ms is None else now_ms
            win = track.window
            if win is None:
                win = track.window = deque(maxlen=self.max_window_entries)
            win.append((stamp, delta, saturated))
            horizon = stamp - self.retain_ms
            while win and win[0][0] < horizon:
                win.popleft()
        interval_s = elapsed_ms / 1000.0
        return RateSample(value, delta, interval_s, delta / interval_s, reset, saturated)

    def update_group(
        self,
        entity: str,
        ts_ms: int,
        names: tuple[str, ...],
        values: tuple[int | None, ...],
        now_ms: int | None = None,
    ) -> Mapping[str, RateSample] | None:
        """Record counters sampled together; None when none moved (the cheap, common case).

        One tuple comparison decides a healthy sample: a quiet NIC costs no per-counter
        work. When something moved, the samples are returned by name, each over the
        group's interval (first sight of a group, or a timestamp that did not advance: an
        empty mapping). A counter absent this time (None) keeps its last value. A group
        with a saturated counter always takes the full path, so its windows keep saying
        "saturated". Counters live as tuple slots, not objects: 10,000 nodes x ~1,000
        counters must neither fill memory nor give the garbage collector millions of
        objects to walk.
        """
        group = self._groups.get(entity)
        if group is not None and group.names is not names and group.names != names:
            group = None  # a new layout (other links or counters): start over
        if group is None:
            if entity not in self._by_root.get(_root(entity), ()):
                self._by_root.setdefault(_root(entity), set()).add(entity)
            sats, index = self._layout(names)
            saturated = any(v is not None and v >= sat for v, sat in zip(values, sats, strict=True))
            self._groups[entity] = _Group(names, values, ts_ms, saturated, sats, index)
            return {}
        prev = group.values
        merged = values
        if None in values:  # absent: unchanged (a delta report) or not read this time
            merged = tuple([p if v is None else v for v, p in zip(values, prev, strict=True)])
        if merged == prev and not group.saturated:
            group.ts_ms = max(group.ts_ms, ts_ms)
            return None
        elapsed_ms = ts_ms - group.ts_ms
        group.values = merged
        if elapsed_ms <= 0:  # duplicate report or clock stepped back: re-base, no sample
            group.saturated = any(v is not None and v >= sat for v, sat in zip(merged, group.sats, strict=True))
            return {}
        group.ts_ms = ts_ms
        stamp = ts_ms if now_ms is None else now_ms
        saturated_any = False
        sats = group.sats
        for i, value in enumerate(values):
            if value is None:
                continue
            p = prev[i]
            sat = value >= sats[i]
            if sat:
                saturated_any = True
            if p is None or (value == p and not sat):
                continue
            delta = value if value < p else value - p
            if not (delta or sat):
                continue
            windows = group.windows
            if windows is None:
                windows = group.windows = {}
            name = names[i]
            win = windows.get(name)
            if win is None:
                win = windows[name] = deque(maxlen=self.max_window_entries)
            win.append((stamp, delta, sat))
            horizon = stamp - self.retain_ms
            while win and win[0][0] < horizon:
                win.popleft()
        group.saturated = saturated_any
        return GroupSamples(group, prev, values, elapsed_ms / 1000.0)

    def unchanged(self, entity: str, ts_ms: int, names: tuple[str, ...]) -> bool:
        """``update_group`` for values known to equal the group's last ones, without them.

        True when that call would have answered None (same layout, nothing saturated) and
        its one effect is done: the group's time moves to ``ts_ms`` if later. False when
        the caller must pass the values (no such group, another layout, or saturated).
        """
        group = self._groups.get(entity)
        if group is None or group.saturated or (group.names is not names and group.names != names):
            return False
        group.ts_ms = max(group.ts_ms, ts_ms)
        return True

    def _layout(self, names: tuple[str, ...]) -> tuple[tuple[int, ...], dict[str, int]]:
        """Saturation values and the name index of a counter layout (shared, cached)."""
        cached = self._layouts.get(names)
        if cached is None:
            cached = self._layouts[names] = (
                tuple(self.saturation_of(n) for n in names),
                {n: i for i, n in enumerate(names)},
            )
        return cached

    def window_sum(self, entity: str, counter: str, window_s: float, now_ms: int) -> tuple[int, bool]:
        """(sum of deltas stamped within the last ``window_s``, whether any was saturated)."""
        group = self._groups.get(entity)
        if group is not None and counter in group.index:
            win = group.windows.get(counter) if group.windows is not None else None
        else:
            tracks = self._tracks.get(entity)
            track = tracks.get(counter) if tracks is not None else None
            win = track.window if track is not None else None
        if not win:
            return 0, False
        since = now_ms - int(window_s * 1000)
        total = 0
        saturated = False
        for stamp, delta, sat in reversed(win):
            if stamp <= since:
                break
            total += delta
            saturated = saturated or sat
        return total, saturated

    def last(self, entity: str, counter: str) -> int | None:
        """The last value seen, None when never seen."""
        group = self._groups.get(entity)
        if group is not None and counter in group.index:
            return group.values[group.index[counter]]
        tracks = self._tracks.get(entity)
        track = tracks.get(counter) if tracks is not None else None
        return None if track is None else track.value

    def forget(self, entity: str) -> int:
        """Drop an entity, or a node and every entity under it; returns how many were dropped."""
        under = self._by_root.pop(entity, None)
        names = set(under) if under is not None else set()
        if entity in self._tracks or entity in self._groups:
            names.add(entity)
            root = _root(entity)
            if root != entity and root in self._by_root:
                self._by_root[root].discard(entity)
        for name in names:
            self._tracks.pop(name, None)
            self._groups.pop(name, None)
            self._overflow_logged.discard(name)
        return len(names)

    def __len__(self) -> int:
        """Number of tracked (entity, counter) pairs."""
        grouped = sum(sum(1 for v in g.values if v is not None) for g in self._groups.values())
        return sum(len(t) for t in self._tracks.values()) + grouped

    def entities(self) -> list[str]:
        return list(dict.fromkeys([*self._tracks, *self._groups]))
