"""Fail-slow detection: a node persistently slower than its peers.

A straggler rarely trips an absolute threshold: a GPU stuck at a lower clock, a NIC that
negotiated half its rate, or a node whose step time drifts up keeps "working" while it
drags the whole synchronous job down. The only reliable reference is the node's peers
doing the same work, so each node's signals are compared with the rest of its group:
the nodes of one training job (as the ranks report it in ``Report.job_steps``) or, when
no job is known, whatever ``group_of`` says (typically the node's block).

The comparison is robust (median and MAD), so one bad node cannot drag the baseline it is
measured against, and relative (the gap must also be a sizeable fraction of the group
median), so a group whose MAD is about zero does not flag a 1 % difference. A uniformly
slow group has a uniformly slow median and flags nobody: that is a job or a fleet
problem, not a node to evict.
"""

from __future__ import annotations

import math
import statistics
from bisect import bisect_left, insort
from collections import Counter, deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

import structlog

from controller.detect.failslow_groups import PeerGroups
from controller.detect.model import Condition, ConditionChange
from starpulse.core.clock import Clock
from starpulse.core.schema import setting
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

# Per-node signals, as extracted from one report.
SIGNAL_SM_CLOCK = "sm_clock_mhz"  # mean SM clock over the node's GPUs, MHz
SIGNAL_POWER = "power_w"  # mean GPU power draw, W
SIGNAL_UTIL = "gpu_util_pct"  # mean GPU utilization, %
SIGNAL_NIC = "nic_gbps"  # summed NIC throughput (tx + rx) over the node's RDMA ports, Gb/s
SIGNAL_STEP_TIME = "step_time_s"  # mean training step time of the node's ranks, s
SIGNALS: tuple[str, ...] = (SIGNAL_SM_CLOCK, SIGNAL_POWER, SIGNAL_UTIL, SIGNAL_NIC, SIGNAL_STEP_TIME)
# For these, slower means higher; for every other signal slower means lower.
HIGHER_IS_SLOWER: frozenset[str] = frozenset({SIGNAL_STEP_TIME})

RULE = "failslow"
CATEGORY = "failslow"
ACTION = "investigate"

# Scale that makes MAD a consistent estimator of the standard deviation for normal data
# (Iglewicz and Hoaglin's modified z-score: 0.6745 * (x - median) / MAD).
_MAD_SCALE = 0.6745
# IBA PortCounters port_xmit_data / port_rcv_data count 4-byte words ("octets divided by
# 4"); mlx5 reports them the same way on RoCE (Ethernet link layer), so both layers are
# treated as words * 4 bytes.
_BYTES_PER_WORD = 4
_GPU_SIGNALS = attrgetter("sm_clock_mhz", "power_w", "utilization_gpu_pct")
_NIC_FIELDS = attrgetter("rdma_device", "port", "counters")


@dataclass
class FailSlowConfig:
    """Tuning of the peer comparison. Defaults suit reports every few seconds."""

    window_s: float = setting(
        300.0,
        "Seconds of samples a node's value is the median of: long enough to ride out a checkpoint or "
        "an eval pause, short enough to catch a node that degraded today",
        gt=0,
    )
    min_samples: int = setting(
        5, "Samples a node needs in the window before it is compared (or counted as a peer)", ge=1
    )
    z_threshold: float = setting(
        3.5, "Robust z-score (0.6745 * gap / MAD) a node must reach; 3.5 is Iglewicz-Hoaglin's outlier cut", gt=0
    )
    min_relative_deviation: float = setting(
        0.1,
        "Fraction of the group median the gap must also reach (0.1 = 10 % slower); both tests must "
        "pass, so a tight group (MAD near 0) does not flag a trivial gap",
        ge=0,
    )
    persist_evaluations: int = setting(
        3,
        "Consecutive evaluations a node must deviate before it is flagged, and must not deviate before "
        "its condition resolves (hysteresis against one-off blips)",
        ge=1,
    )
    min_group_size: int = setting(
        4,
        "Nodes with enough samples a group needs before anyone in it is compared: with three nodes a "
        "median says little about which one is odd",
        ge=2,
    )
    recent_samples: int = setting(
        3,
        "Latest samples of each node that must show the same gap against the group's latest: a window "
        "median alone flags the node whose samples happened to fall later when a whole job slows at "
        "once (its median turns before its peers'); its latest samples equal theirs, a straggler's do not",
        ge=1,
    )
    signals: tuple[str, ...] = setting(SIGNALS, "Signals to compare", choices=SIGNALS)
    job_ttl_s: float | None = setting(
        None, "Seconds a node stays in the job it last reported in job_steps; null: window_s", gt=0
    )
    sample_every_s: float = setting(
        15.0,
        "Seconds: a node's signals come from at most one report per this period (0: every report); a "
        "median over a 5 min window needs ~20 samples, not one per report (taking every 5 s report was "
        "~15 % of the controller's per-report work); NIC throughput is the counters' rate between samples",
        ge=0,
    )

    def __post_init__(self) -> None:
        unknown = [s for s in self.signals if s not in SIGNALS]
        if unknown:
            raise ValueError(f"unknown fail-slow signals {unknown}; expected some of {SIGNALS}")
        if self.window_s <= 0:
            raise ValueError("window_s must be > 0")
        if self.sample_every_s < 0:
            raise ValueError("sample_every_s must be >= 0")
        if self.sample_every_s and self.window_s / self.sample_every_s < self.min_samples:
            raise ValueError(
                f"a window_s of {self.window_s:g} s sampled every {self.sample_every_s:g} s holds fewer than "
                f"min_samples ({self.min_samples}): nobody would ever be compared"
            )
        if self.min_samples < 1 or self.persist_evaluations < 1 or self.min_group_size < 2:
            raise ValueError("min_samples and persist_evaluations must be >= 1, min_group_size >= 2")
        if self.z_threshold <= 0 or self.min_relative_deviation < 0:
            raise ValueError("z_threshold must be > 0 and min_relative_deviation >= 0")


@dataclass
class Deviation:
    """One signal on which a node is slower than its group."""

    signal: str
    value: float
    group_median: float
    mad: float
    z: float  # math.inf when the group's MAD is 0
    relative: float  # gap / |group median|, > 0 means slower
    group: str
    peers: int

    def to_evidence(self) -> dict[str, Any]:
        return {
            "signal": self.signal,
            "value": round(self.value, 4),
            "group_median": round(self.group_median, 4),
            "mad": round(self.mad, 4),
            "z": round(self.z, 2) if math.isfinite(self.z) else None,  # None: MAD was 0
            "relative_deviation": round(self.relative, 4),
            "group": self.group,
            "peers": self.peers,
        }


@dataclass
class _NodeState:
    hits: int = 0
    clears: int = 0
    condition: Condition | None = None
    signals: tuple[str, ...] = ()


class _Window:
    """One signal's samples in time order, and the same values kept sorted.

    Why: every evaluation takes the median of every node's window of every signal, 50,000
    windows at 10,000 nodes; sorting each then held the controller's event loop ~0.4 s every
    5 s. Kept sorted as samples come and go, a median is one index (the same value
    statistics.median gives).
    """

    __slots__ = ("_latest", "ordered", "times", "values")

    def __init__(self) -> None:
        self.times: deque[int] = deque()
        self.values: deque[float] = deque()
        self.ordered: list[float] = []
        self._latest: float | None = None  # latest(): kept until a sample comes or goes

    def append(self, sample: tuple[int, float]) -> None:
        at, value = sample
        self.times.append(at)
        self.values.append(value)
        insort(self.ordered, value)
        self._latest = None

    def prune(self, cutoff: int) -> bool:
        """Drop the samples taken before ``cutoff``; True if it dropped any."""
        times, values, ordered = self.times, self.values, self.ordered
        dropped = False
        while times and times[0] < cutoff:
            times.popleft()
            del ordered[bisect_left(ordered, values.popleft())]
            dropped = True
        if dropped:
            self._latest = None
        return dropped

    def latest(self, count: int) -> float:
        """The median of the latest ``count`` samples (all if fewer): FailSlowConfig.recent_samples.

        Kept between evaluations: a node samples every sample_every_s (15 s), the comparison
        runs every 5 s, so most windows have not changed since it was last taken.
        """
        cached = self._latest
        if cached is None:
            values = self.values
            n = min(count, len(values))
            cached = self._latest = _median_sorted(sorted([values[-i] for i in range(1, n + 1)]))
        return cached

    def median(self) -> float:
        ordered = self.ordered
        mid = len(ordered) // 2
        return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2

    def __len__(self) -> int:
        return len(self.times)

    def __getitem__(self, index: int) -> tuple[int, float]:
        return self.times[index], self.values[index]


@dataclass
class _NodeSamples:
    series: dict[str, _Window] = field(default_factory=dict)
    # port (rdma_device, port number) -> (timestamp ms, words)
    nic_prev: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    # port -> (tx, rx) of the last full report
    nic_base: dict[tuple[str, int], tuple[int, int]] = field(default_factory=dict)
    job: str | None = None
    job_seen_ms: int = 0
    sampled_ms: int | None = None  # controller time of the last report signals were taken from


def _keep_nic_base(ns: _NodeSamples, nics: Iterable[tpb.NicSample]) -> None:
    """A full report not sampled still sets the tx/rx a later delta report's absent counters equal."""
    for nic in nics:
        dev, num, counters = _NIC_FIELDS(nic)
        tx, rx = counters.get("port_xmit_data"), counters.get("port_rcv_data")
        if tx is not None and rx is not None:
            ns.nic_base[(dev, num)] = (tx, rx)


class FailSlowDetector:
    """Keeps a window of per-node signals and flags nodes persistently slower than their group.

    Feed it every report (``observe``) and call ``evaluate`` periodically (e.g. every
    report interval); it returns condition changes in the same vocabulary as the rule
    engine, so correlation treats a straggler like any other finding.
    """

    def __init__(
        self,
        config: FailSlowConfig | None = None,
        group_of: Callable[[str], str | None] = lambda node: None,
        *,
        clock: Clock,
        group_map: Callable[[], Mapping[str, str]] | None = None,
    ) -> None:
        """``group_of``: a node's peer group when no fresh job names one (None: not compared).
        ``group_map``: the same for every node at once (node -> group, absent: None); given, it
        replaces ``group_of`` and nodes are regrouped only when it changes (PeerGroups).
        """
        self.config = config or FailSlowConfig()
        self.clock = clock
        self._clock_ms = clock.time_ms
        self._nodes: dict[str, _NodeSamples] = {}
        self._state: dict[str, _NodeState] = {}
        self._sample_ms = int(self.config.sample_every_s * 1000)
        cfg = self.config
        ttl_s = cfg.job_ttl_s if cfg.job_ttl_s is not None else cfg.window_s
        self._groups = PeerGroups(group_of, group_map, int(ttl_s * 1000))
        # A group's deviations as last compared, and its members' oldest sample then: it is
        # compared again only when it turns dirty (PeerGroups) or that sample leaves the window.
        self._found: dict[str, dict[str, list[Deviation]]] = {}
        self._oldest: dict[str, int] = {}

    def _node(self, node_id: str) -> _NodeSamples:
        ns = self._nodes.get(node_id)
        if ns is None:
            ns = self._nodes[node_id] = _NodeSamples()
            self._groups.added(node_id)
        return ns

    # -- input ---------------------------------------------------------------------------

    def observe(self, node_id: str, report: tpb.Report) -> None:
        """Extract this report's per-node signals and append them to the node's window."""
        values, job = self.extract(node_id, report)
        self.append(node_id, values, job)

    def extract(self, node_id: str, report: tpb.Report) -> tuple[dict[str, float], str | None]:
        """This report's signals and the job its ranks belong to (None: no ranks named one).

        Nothing (``{}``, None) for a report within ``sample_every_s`` of the node's last
        sample. Split from ``append`` so a detection shard (controller.detect.shard_worker)
        can read the report where it was decoded and send only these few numbers to the
        controller.
        """
        ns = self._node(node_id)
        now = self._clock_ms()
        last = ns.sampled_ms
        if last is not None and now - last < self._sample_ms:
            if not report.counters_delta:
                _keep_nic_base(ns, report.nics)  # later delta reports omit what equals it
            return {}, None
        ns.sampled_ms = now
        return self._extract(ns, report, now)

    def append(self, node_id: str, values: dict[str, float], job: str | None = None) -> None:
        """Add one report's signals to the node's window (what ``evaluate`` compares)."""
        if not values and job is None:
            return  # a report not sampled (sample_every_s)
        now = self._clock_ms()
        ns = self._node(node_id)
        if job is not None:
            ns.job, ns.job_seen_ms = job, now
            self._groups.job_seen(node_id, job, now)
        signals = self.config.signals
        series = ns.series
        changed = False
        for signal, value in values.items():
            if signal in signals and math.isfinite(value):
                window = series.get(signal)
                if window is None:
                    window = series[signal] = _Window()
                window.append((now, value))
                changed = True
        if self._prune(ns, now) or changed:
            self._groups.changed(node_id)

    def _extract(self, ns: _NodeSamples, report: tpb.Report, now: int) -> tuple[dict[str, float], str | None]:
        out: dict[str, float] = {}
        job: str | None = None
        clocks: list[float] = []
        power: list[float] = []
        util: list[float] = []
        # One pass, one C-level read per GPU. Absent reads as 0, so a non-zero value is present;
        # only a zero needs HasField to tell "absent" (skipped) from a real 0 (kept).
        for g in report.gpus:
            clock, watts, busy = _GPU_SIGNALS(g)
            if clock or g.HasField("sm_clock_mhz"):
                clocks.append(clock)
            if watts or g.HasField("power_w"):
                power.append(watts)
            if busy or g.HasField("utilization_gpu_pct"):
                util.append(busy)
        # math.fsum(x) / len(x) is what statistics.fmean computes for a list, without its overhead
        if clocks:
            out[SIGNAL_SM_CLOCK] = math.fsum(clocks) / len(clocks)
        if power:
            out[SIGNAL_POWER] = math.fsum(power) / len(power)
        if util:
            out[SIGNAL_UTIL] = math.fsum(util) / len(util)
        gbps = self._nic_throughput(ns, report.nics, report.timestamp_ms or now, report.counters_delta)
        if gbps is not None:
            out[SIGNAL_NIC] = gbps
        steps = [s for s in report.job_steps if s.step_time_s > 0 and math.isfinite(s.step_time_s)]
        if steps:
            out[SIGNAL_STEP_TIME] = statistics.fmean(s.step_time_s for s in steps)
            # The job the node's ranks belong to; a node hosting ranks of two jobs goes with the
            # one it runs most ranks of (ties: the first name, for determinism).
            counts = Counter(s.job for s in steps if s.job)
            if counts:
                job = min(counts, key=lambda j: (-counts[j], j))
        return out, job

    @staticmethod
    def _nic_throughput(
        ns: _NodeSamples, nics: Iterable[tpb.NicSample], ts_ms: int, delta: bool = False
    ) -> float | None:
        """tx + rx Gb/s summed over the node's ports, from counter deltas since the last report.

        A port whose counters went backwards (driver reload, counter reset) or that has no
        previous sample contributes nothing this time; None when no port had a usable delta.
        In a delta report an absent counter has not moved since the last full report.
        """
        total = 0.0
        usable = False
        for nic in nics:
            dev, num, counters = _NIC_FIELDS(nic)
            port = (dev, num)
            prev = ns.nic_prev.get(port)
            tx, rx = counters.get("port_xmit_data"), counters.get("port_rcv_data")
            if tx is None or rx is None:
                base = ns.nic_base.get(port) if delta else None
                if base is None:
                    continue
                tx = base[0] if tx is None else tx
                rx = base[1] if rx is None else rx
            elif not delta:
                ns.nic_base[port] = (tx, rx)
            words = int(tx) + int(rx)
            ns.nic_prev[port] = (ts_ms, words)
            if prev is None or ts_ms <= prev[0] or words < prev[1]:
                continue
            seconds = (ts_ms - prev[0]) / 1000.0
            total += (words - prev[1]) * _BYTES_PER_WORD * 8 / seconds / 1e9
            usable = True
        return total if usable else None

    def forget(self, node_id: str) -> ConditionChange | None:
        """Drop a node (decommissioned, replaced); resolves its condition if it had one."""
        self._nodes.pop(node_id, None)
        self._groups.forget(node_id)
        state = self._state.pop(node_id, None)
        if state is None or state.condition is None:
            return None
        cond = state.condition
        cond.resolved_ms = self._clock_ms()
        log.info("failslow_forgotten", node=node_id)
        return ConditionChange("resolved", cond)

    # -- evaluation ----------------------------------------------------------------------

    def groups(self) -> dict[str, list[str]]:
        """Current peer groups (``job:<name>`` for a fresh reported job, else ``group_of``), members sorted."""
        self._groups.refresh(self._nodes, self._clock_ms())
        return {group: sorted(members) for group, members in sorted(self._groups.members.items())}

    def _deviation_steps(self, found: dict[str, list[Deviation]], nodes_per_step: float) -> Iterator[None]:
        """Fill ``found``, comparing again only the groups that changed, pausing (yield) after
        about ``nodes_per_step`` nodes (inside a group larger than that too).

        A group whose members, their windows and their windows' oldest samples are as they
        were keeps its last deviations: comparing it again would find the same (the verdicts
        of every group compared every time, pinned by tests/controller/detect/test_failslow_equivalence.py).
        The pauses let the controller's event loop decide reports in between.
        """
        now = self._clock_ms()
        cutoff = now - int(self.config.window_s * 1000)
        peers = self._groups
        pace = _Pace(nodes_per_step)
        pace.spend(peers.refresh(self._nodes, now))
        if pace.due():
            yield  # the whole fleet regrouped (the peer map changed): a step of its own
        todo = peers.dirty
        peers.dirty = set()
        todo.update(group for group, oldest in self._oldest.items() if oldest < cutoff)
        for group in sorted(todo):
            members = peers.members.get(group)
            if members is None:  # no node left in it
                self._found.pop(group, None)
                self._oldest.pop(group, None)
                continue
            deviations, oldest = yield from self._compare(group, list(members), cutoff, pace)
            if deviations:
                self._found[group] = deviations
            else:
                self._found.pop(group, None)
            if oldest is None:
                self._oldest.pop(group, None)
            else:
                self._oldest[group] = oldest
        for deviations in self._found.values():
            found.update(deviations)

    def _compare(
        self, group: str, members: list[str], cutoff: int, pace: _Pace
    ) -> Generator[None, None, tuple[dict[str, list[Deviation]], int | None]]:
        """One group's slower nodes, and its members' oldest sample in the window (None: none).

        A group larger than a step (a job over the fleet) pauses inside: during the walk of its
        members, after each signal's comparison, and while its latest samples are read.
        """
        cfg = self.config
        found: dict[str, list[Deviation]] = {}
        if len(members) < cfg.min_group_size:
            return found, None  # nothing to compare until its members change
        medians, windows, oldest = yield from self._windows(members, cutoff, pace)
        big = len(members) > pace.per_step
        for signal in cfg.signals:
            values = medians[signal]
            if len(values) < cfg.min_group_size:
                continue
            higher_slower = signal in HIGHER_IS_SLOWER
            slower = self._slower(signal, values, higher_slower, group)
            if big:  # a few sorts of 10,000 values
                pace.spend(len(values) // 2)
                if pace.due():
                    yield
            if not slower:
                continue
            # The latest samples must agree (recent_samples): see FailSlowConfig.recent_samples.
            latest = yield from self._latest_values(windows[signal], pace if big else None)
            for node in self._still_slower(latest, higher_slower, slower):
                found.setdefault(node, []).append(slower[node])
            if big:
                pace.spend(len(values) // 2)
                if pace.due():
                    yield
        return found, oldest

    def _windows(self, members: list[str], cutoff: int, pace: _Pace) -> Generator[None, None, _GroupWindows]:
        """Per signal, the members' window medians and windows (those with min_samples, pruned
        to ``cutoff``), and the oldest sample left."""
        min_samples = self.config.min_samples
        medians: dict[str, dict[str, float]] = {signal: {} for signal in self.config.signals}
        windows: dict[str, dict[str, _Window]] = {signal: {} for signal in self.config.signals}
        oldest: int | None = None
        for node in members:
            if pace.due():
                yield  # every nodes_per_step nodes, inside a group too: the loop decides reports in between
            pace.spend(1)
            ns = self._nodes.get(node)
            if ns is None:
                continue  # forgotten while an evaluation paused
            for signal, window in ns.series.items():
                times = window.times
                if times and times[0] < cutoff:
                    window.prune(cutoff)  # a node that went quiet: its old samples leave
                if not times:
                    continue
                first = times[0]
                if oldest is None or first < oldest:
                    oldest = first
                if len(times) >= min_samples:
                    per_node = medians.get(signal)
                    if per_node is not None:
                        per_node[node] = window.median()
                        windows[signal][node] = window
        return medians, windows, oldest

    def _latest_values(
        self, windows: dict[str, _Window], pace: _Pace | None
    ) -> Generator[None, None, dict[str, float]]:
        """Each window's latest-samples median; with ``pace``, in steps' worth of nodes."""
        recent = self.config.recent_samples
        if pace is None:
            return {node: w.latest(recent) for node, w in windows.items()}
        out: dict[str, float] = {}
        items = list(windows.items())
        chunk = max(1, int(pace.per_step))
        for start in range(0, len(items), chunk):
            if pace.due():
                yield
            part = items[start : start + chunk]
            out.update((node, w.latest(recent)) for node, w in part)
            pace.spend(len(part))
        return out

    def _slower(self, signal: str, values: dict[str, float], higher_slower: bool, group: str) -> dict[str, Deviation]:
        """The nodes whose value is slower than the group's median by both tests (z and relative)."""
        cfg = self.config
        med = _median_sorted(sorted(values.values()))
        if med <= 0:
            return {}  # an idle group (no traffic, no steps): nothing to be slower than
        out: dict[str, Deviation] = {}
        scale = abs(med)
        # The relative test first: when nobody passes it (most groups, most signals) the MAD is not needed.
        candidates: list[tuple[str, float, float]] = []
        for node, value in values.items():
            gap = value - med if higher_slower else med - value
            if gap > 0 and gap / scale >= cfg.min_relative_deviation:
                candidates.append((node, value, gap))
        if not candidates:
            return out
        mad = _median_sorted(sorted([abs(v - med) for v in values.values()]))
        for node, value, gap in candidates:
            z = _MAD_SCALE * gap / mad if mad > 0 else math.inf
            if z >= cfg.z_threshold:
                out[node] = Deviation(signal, value, med, mad, z, gap / scale, group, len(values) - 1)
        return out

    def _still_slower(self, latest: dict[str, float], higher_slower: bool, nodes: Iterable[str]) -> list[str]:
        """Of ``nodes``, those whose latest value is slower than the group's latest by both tests
        (``_slower`` on ``latest``, asked only about the nodes that matter)."""
        cfg = self.config
        med = _median_sorted(sorted(latest.values()))
        if med <= 0:
            return []
        scale = abs(med)
        passed: list[tuple[str, float]] = []
        for node in nodes:
            value = latest[node]
            gap = value - med if higher_slower else med - value
            if gap > 0 and gap / scale >= cfg.min_relative_deviation:
                passed.append((node, gap))
        if not passed:
            return []
        mad = _median_sorted(sorted([abs(v - med) for v in latest.values()]))
        return [node for node, gap in passed if (_MAD_SCALE * gap / mad if mad > 0 else math.inf) >= cfg.z_threshold]

    def evaluate(self) -> list[ConditionChange]:
        """Compare every node with its group; open, update or resolve fail-slow conditions."""
        changes: list[ConditionChange] = []
        for _ in self.evaluation_steps(changes, math.inf):
            pass
        return changes

    def evaluation_steps(self, changes: list[ConditionChange], nodes_per_step: float = 500) -> Iterator[None]:
        """``evaluate`` in steps: the comparison pauses (yield) after grouping and every ``nodes_per_step`` nodes.

        The controller runs one step per turn of its event loop, so one evaluation of a
        large fleet never holds the loop for long; the verdicts, applied at the end, are
        those ``evaluate`` reaches. ``changes`` receives the condition changes.
        """
        found: dict[str, list[Deviation]] = {}
        yield from self._deviation_steps(found, nodes_per_step)
        changes += self._apply(found)

    def _apply(self, found: dict[str, list[Deviation]]) -> list[ConditionChange]:
        """Persistence: a node slower for persist_evaluations evaluations opens; as many clean ones resolve."""
        now = self._clock_ms()
        cfg = self.config
        changes: list[ConditionChange] = []
        for node in sorted(set(found) | set(self._state)):
            if node not in self._nodes and node not in self._state:
                continue  # forgotten while an evaluation paused
            state = self._state.setdefault(node, _NodeState())
            devs = found.get(node)
            if devs:
                state.hits += 1
                state.clears = 0
                worst = max(devs, key=lambda d: (d.relative, d.signal))
                signals = tuple(sorted(d.signal for d in devs))
                evidence = worst.to_evidence()
                evidence["signals"] = {d.signal: d.to_evidence() for d in devs}
                message = (
                    f"{node} {worst.signal} {worst.value:.3g} vs {worst.group} median {worst.group_median:.3g} "
                    f"({worst.relative:.0%} slower, {worst.peers} peers, {cfg.window_s:g}s window)"
                )
                cond = state.condition
                if cond is None and state.hits >= cfg.persist_evaluations:
                    cond = Condition(
                        rule=RULE,
                        component=node,
                        component_type="node",
                        category=CATEGORY,
                        node=node,
                        severity="warning",
                        action=ACTION,
                        message=message,
                        first_seen_ms=now,
                        last_seen_ms=now,
                        count=state.hits,
                        evidence=evidence,
                    )
                    state.condition = cond
                    state.signals = signals
                    changes.append(ConditionChange("opened", cond))
                    log.info(
                        "failslow_flagged",
                        node=node,
                        signal=worst.signal,
                        group=worst.group,
                        value=worst.value,
                        group_median=worst.group_median,
                        relative=round(worst.relative, 3),
                    )
                elif cond is not None:
                    cond.last_seen_ms = now
                    cond.count += 1
                    cond.evidence = evidence
                    cond.message = message
                    if signals != state.signals:
                        state.signals = signals
                        changes.append(ConditionChange("updated", cond))
            else:
                state.clears += 1
                state.hits = 0
                cond = state.condition
                if cond is not None and state.clears >= cfg.persist_evaluations:
                    cond.resolved_ms = now
                    changes.append(ConditionChange("resolved", cond))
                    log.info("failslow_cleared", node=node)
                    state.condition = None
                    state.signals = ()
                if state.condition is None and state.hits == 0:
                    del self._state[node]  # nothing to remember about a healthy node
        return changes

    def active(self) -> list[Condition]:
        """Fail-slow conditions currently open."""
        return [s.condition for _, s in sorted(self._state.items()) if s.condition is not None]

    def _prune(self, ns: _NodeSamples, now: int) -> bool:
        cutoff = now - int(self.config.window_s * 1000)
        dropped = False
        for window in ns.series.values():
            if window.prune(cutoff):
                dropped = True
        return dropped


def _median_sorted(data: list[float]) -> float:
    """statistics.median of already sorted data, the same arithmetic without its checks and copy."""
    n = len(data)
    mid = n // 2
    return data[mid] if n % 2 else (data[mid - 1] + data[mid]) / 2


# What a group's walk gives: per signal the members' window medians and windows, and the oldest sample left.
_GroupWindows = tuple[dict[str, dict[str, float]], dict[str, dict[str, "_Window"]], int | None]


class _Pace:
    """Counts the nodes an evaluation went through; says when to pause (every ``per_step``)."""

    __slots__ = ("left", "per_step")

    def __init__(self, per_step: float) -> None:
        self.per_step = per_step
        self.left = per_step

    def spend(self, nodes: int) -> None:
        self.left -= nodes

    def due(self) -> bool:
        """True: a step's worth since the last pause, pause now (and count again)."""
        if self.left > 0:
            return False
        self.left = self.per_step
        return True
