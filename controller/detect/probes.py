"""Localising what probes see: the component most likely at fault, by voting on the fabric graph.

Method: 007's voting (Arzani et al., NSDI'18), extended from links to every component a probe
crosses. Each lost probe votes for every component on its path (the two NICs with their
cables, the two hosts, the leaf or leaves, and, where the flow was traced, the spine and the
two leaf-spine cables). The component with the most votes is blamed, every observation
through it is taken out (it is explained), and the vote runs again on what is left, so two
faults are two answers. Votes within 10 % of the most count as a tie, broken by the loss
*rate* through the component (lost / sent): a bad NIC and its leaf get the same votes, but
the NIC's rate is its whole loss while the leaf's is diluted by its healthy NICs; a bad leaf
out-votes each of its NICs. A second pass votes the same way with slow observations (network
p99 round trip over ``rtt_threshold_us``, the responder's own time already taken out), where a
host whose every probe is slow out-votes its NICs and leaves: a host problem, not the network's.

A leaf blamed while its own same-leaf pairs are clean lost its probes on the way up: an
uplink whose spine is not known (flows not traced) is a ``path`` condition on the leaf, which
becomes a ``path_fault`` incident, not a switch fault.

Inputs are observations decoded from reports where the reports are decided (here or in a
detection shard, controller.detect.shard_worker), carried to this one place in the verdict
(``ReportResult.probes``), since only the controller holds the whole fabric. Observations
involving a node that is not online, re-registered within the window, or whose responder
restarted (``peer_restarted``) are left out: a peer's restart or drain is not a network fault.

No cry wolf: a component needs ``min_lost`` lost probes and ``loss_threshold`` loss over the
window, and its losses must stand out from the fabric's background (the window's loss over
every counted probe) at ``background_alpha`` (controller.detect.probe_background): an even
background loss is one fabric-wide finding (``background_loss``), not a fault per NIC. It
becomes a condition after ``persist_windows`` localisations in a row name it, and resolves
after ``clear_windows`` in a row do not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import structlog

from controller.detect import probe_persist
from controller.detect.model import ComponentType, Condition, ConditionChange
from controller.detect.probe_background import DELAY_SAMPLE, DelayBaseline, delay_baseline, stands_out
from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core import vocab
from starpulse.core.clock import Clock
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

_TIE = 0.9  # votes within 10 % of the most are a tie
_NODE_SIDE = frozenset({"nic", "node", "gpu"})  # components whose blame takes a node out
RULE_LOSS = "probe.loss"
RULE_DELAY = "probe.delay"
_FABRIC_KINDS = {"leaf", "spine", "link"}  # what fabric_health holds


class ProbeObs(NamedTuple):
    """One flow's (or one target's) results for one window, as a verdict carries them."""

    local_nic: str
    peer_nic: str
    via: str
    sent: int
    lost: int
    rtt_p99_us: float
    responder_us: float
    restarted: bool


def observations(report: tpb.Report) -> list[ProbeObs]:
    """A report's probe results, decoded (here or in a shard) into plain tuples."""
    return [
        ProbeObs(r.local_nic, r.peer_nic, r.via, r.sent, r.lost, r.rtt_p99_us, r.responder_us, r.peer_restarted)
        for r in report.probe_results
        if r.sent > 0
    ]


@dataclass
class Blame:
    component: str
    kind: str  # "nic" | "node" | "leaf" | "spine" | "link" | "path"
    what: str  # "loss" | "delay"
    votes: float
    sent: int
    lost: int
    pairs: list[dict[str, Any]]

    @property
    def rate(self) -> float:
        return self.lost / self.sent if self.sent else 0.0


class _Path(NamedTuple):
    obs: ProbeObs
    comps: tuple[str, ...]
    same_leaf: bool
    leaf: str  # the local leaf (for the path check)
    # Leaf-spine cables a result summed over its flows (no spine named) crossed in even shares:
    # they count towards those cables' traffic (the denominators), never their votes.
    spread: tuple[tuple[str, float], ...] = ()  # (component, its share of the result's traffic)


class _Where(NamedTuple):
    comps: tuple[str, ...]
    same_leaf: bool
    leaf: str
    hosts: tuple[str, str]
    spread: tuple[tuple[str, float], ...]
    pair: tuple[str, str] | None  # the leaf pair a summed (untraced) result spreads over
    switches: tuple[str, ...] = ()  # of comps, the fabric's own: leaves, the spine, leaf-spine cables


class _Sums:
    """One key's window, summed as results arrive and expire: what the vote needs without a pass."""

    __slots__ = ("answered", "lost", "results", "sent", "slow", "where")

    def __init__(self, where: _Where | None) -> None:
        self.where = where  # the key's path (None off the fabric), refreshed when the wiring changes
        self.results: deque[tuple[int, ProbeObs]] = deque()
        self.sent = 0
        self.lost = 0
        self.slow = 0  # answered results whose p99 reached the delay threshold
        self.answered = False  # the summed result was answered (sent > lost): one delay denominator

    def p99(self) -> float:
        """The worst network p99 of the window's answered results (as summing them would give)."""
        worst = 0.0
        for _, o in self.results:
            if o.sent > o.lost and o.rtt_p99_us > worst:
                worst = o.rtt_p99_us
        return worst


class ProbeLocaliser:
    """Holds the window's observations and turns them into conditions (see the module docstring).

    Cost at fleet size: every result is added to its path's sums and to the running traffic of
    each component on the path as it arrives, and taken out as it leaves the window (a global
    arrival queue, so expiry touches only what expires). A localisation on a clean fabric is
    then a check of the hosts and an empty set of bad paths; with faults, the vote reads the
    running denominators and touches only the bad paths (plus one scan of the paths per blamed
    component, to take out what it explains). ``fabric_health`` (the topology view: the
    dashboard's cable colours, ``starpulse topology show``'s worst links) reads the same running
    sums for the fabric's own components (leaves, spines, leaf-spine cables), and each one's
    worst p99 is a sliding-window maximum (a deque of falling round trips per component, filled
    as results arrive, trimmed as they age), so reading it touches those components, not the
    window's results (it was a pass over every path and every NIC and host, 0.3-0.8 s on the
    loop at 2,048 nodes). ``health`` (every component, NICs and hosts too) is still one pass
    over the paths; nothing on the serving path reads it. Both are worked out once per
    localisation at most.
    """

    def __init__(
        self,
        fabric: Fabric,
        config: ProbeConfig,
        *,
        clock: Clock,
        node_ok: Callable[[str, int], bool] = lambda node, since_ms: True,
    ) -> None:
        """``node_ok(node, since_ms)``: the node is online and was connected before ``since_ms``."""
        self.fabric = fabric
        self.config = config
        self.clock = clock
        self.node_ok = node_ok
        # (local NIC, peer NIC, via) -> its window's results (received ms, result) and their sums
        self._window: dict[tuple[str, str, str], _Sums] = {}
        self._arrivals: deque[tuple[int, tuple[str, str, str]]] = deque()  # every result, oldest first
        self._bad: dict[tuple[str, str, str], None] = {}  # keys whose window lost or was slow (ordered set)
        # Running traffic through each component of keys on the fabric: sent (loss denominators),
        # lost, answered keys (delay denominators); summed results per leaf pair for the spines.
        self._csent: dict[str, int] = {}
        self._clost: dict[str, int] = {}
        self._cans: dict[str, int] = {}
        self._psent: dict[tuple[str, str], int] = {}
        self._pans: dict[tuple[str, str], int] = {}
        self._tsent = self._tlost = 0  # every key on the fabric: the background's sums
        self.background_loss: float | None = None  # the last localisation's, None without traffic
        # the fabric's round-trip baseline, taken when a localisation has slow paths to vote on
        self.delay_baseline: DelayBaseline | None = None
        self._delay_cut = config.rtt_threshold_us  # what a path's p99 must reach to vote slow
        self._host_keys: dict[str, set[tuple[str, str, str]]] = {}
        self._stale = False  # the wiring changed: the running sums are rebuilt at the next localisation
        self._comps: dict[tuple[str, str, str], _Where | None] = {}
        self._spreads: dict[tuple[str, str], tuple[tuple[str, float], ...]] = {}  # leaf pair -> shares
        self._streak: dict[tuple[str, str], int] = {}  # (rule, component) -> localisations in a row
        self._kind_run: dict[tuple[str, str], tuple[str, int]] = {}  # -> (kind, in a row as that kind)
        self._clean: dict[tuple[str, str], int] = {}
        self._open: dict[tuple[str, str], Condition] = {}
        self._last_run = clock.monotonic()
        self.last_blames: list[Blame] = []
        self._horizon = 0
        self._excluded: set[tuple[str, str, str]] = set()
        self._health: dict[str, dict[str, Any]] | None = None
        self._fabric_health: dict[str, dict[str, Any]] | None = None
        self._switchy: set[str] = set()  # every leaf, spine and cable a path crosses or spreads over
        # fabric component -> (received ms, p99) of the window's answered results through it, p99
        # falling from the front: the front is its worst p99 once the aged-out ones are trimmed
        self._cworst: dict[str, deque[tuple[int, float]]] = {}
        self._expired_to = 0  # the horizon of the latest expiry: results before it are gone
        self._switch_addresses: dict[str, str] | None = None  # a traced flow's spine address -> its name

    @property
    def health(self) -> dict[str, dict[str, Any]]:
        """Every probed component's health over the last localisation's window: kind, sent, lost,
        loss share, the worst network p99 (NICs and hosts too: a pass over every path)."""
        if self._health is None:
            self._health = self._health_now(None)
        return self._health

    @property
    def fabric_health(self) -> dict[str, dict[str, Any]]:
        """``health`` of the fabric's own components (leaves, spines, leaf-spine cables): what the
        topology view shows (the dashboard's colours, the CLI's worst links), from running sums."""
        if self._fabric_health is None:
            self._fabric_health = self._health_now(self._switchy)
        return self._fabric_health

    # -- input ---------------------------------------------------------------------------
    def add(self, node: str, obs: list[ProbeObs]) -> None:
        """A report's results; a restarted peer's are left out (its losses were its restart)."""
        now = self.clock.time_ms()
        # what aged out goes as reports come, a little each time, not all at the localisation
        self._expire(now - int(self.config.localise_window_s * 1000))
        threshold = self.config.rtt_threshold_us
        peaks: dict[str, float] = {}  # each fabric component's worst p99 in this report (one arrival time)
        for given in obs:
            if given.restarted:
                continue
            o = given
            if o.via and o.via not in self.fabric:  # a traced flow names its spine by address
                o = given._replace(via=self._switch_at(given.via))
            key = (o.local_nic, o.peer_nic, o.via)
            s = self._window.get(key)
            if s is None:
                where = self._path_of(key)
                s = self._window[key] = _Sums(where)
                if where is not None and not self._stale:
                    for h in where.hosts:
                        self._host_keys.setdefault(h, set()).add(key)
            s.results.append((now, o))
            self._arrivals.append((now, key))
            slow = 1 if o.sent > o.lost and o.rtt_p99_us >= threshold else 0
            self._change(key, s, o.sent, o.lost, slow)
            p99 = o.rtt_p99_us
            if s.where is not None and not self._stale and o.sent > o.lost and p99 > 0.0:
                for c in s.where.switches:
                    if p99 > peaks.get(c, 0.0):
                        peaks[c] = p99
        if peaks:
            self._push_worst(peaks, now)

    def _push_worst(self, peaks: dict[str, float], now: int) -> None:
        """Answered results' worst p99 per component, all received at ``now``, into each
        component's sliding maximum (amortised O(1))."""
        cworst = self._cworst
        horizon = self._expired_to
        for c, p99 in peaks.items():
            dq = cworst.get(c)
            if dq is None:
                dq = cworst[c] = deque()
            elif dq[0][0] < horizon:  # aged out (bounded even when nobody reads the health)
                while dq and dq[0][0] < horizon:
                    dq.popleft()
            while dq and dq[-1][1] <= p99:
                dq.pop()  # never the worst again: this one is as bad and stays longer
            dq.append((now, p99))

    def _switch_at(self, address: str) -> str:
        """The switch a traced flow's address names (its ICMP time-exceeded came from it), from
        the fabric's switch attribute ``addresses``; "" (untraced) for an address it does not give."""
        if self._switch_addresses is None:
            self._switch_addresses = {}
            for name, attrs in self.fabric.graph.nodes(data=True):
                given = attrs.get("addresses")
                if isinstance(given, list | tuple):
                    for a in given:
                        if isinstance(a, str):
                            self._switch_addresses[a] = name
        return self._switch_addresses.get(address, "")

    def _change(self, key: tuple[str, str, str], s: _Sums, sent: int, lost: int, slow: int) -> None:
        """Add (or, negative, take out) one result's counts to its key and the components on its path."""
        was = s.answered
        s.sent += sent
        s.lost += lost
        s.slow += slow
        s.answered = s.sent > s.lost
        if s.lost > 0 or s.slow > 0:
            self._bad[key] = None
        elif lost or slow:  # it may have been bad until now
            self._bad.pop(key, None)
        where = s.where
        if where is None or self._stale:
            return
        self._apply(where, sent, lost, int(s.answered) - int(was))

    def _apply(self, where: _Where, sent: int, lost: int, ans: int) -> None:
        csent, clost, cans = self._csent, self._clost, self._cans
        self._tsent += sent
        self._tlost += lost
        for c in where.comps:
            csent[c] = csent.get(c, 0) + sent
            if lost:
                clost[c] = clost.get(c, 0) + lost
            if ans:
                cans[c] = cans.get(c, 0) + ans
        if where.pair is not None:
            self._psent[where.pair] = self._psent.get(where.pair, 0) + sent
            if ans:
                self._pans[where.pair] = self._pans.get(where.pair, 0) + ans

    def _expire(self, horizon: int) -> None:
        """Take out every result received before the horizon (only what expires is touched)."""
        threshold = self.config.rtt_threshold_us
        arrivals = self._arrivals
        self._expired_to = max(self._expired_to, horizon)
        while arrivals and arrivals[0][0] < horizon:
            _, key = arrivals.popleft()
            s = self._window[key]
            _, o = s.results.popleft()
            slow = 1 if o.sent > o.lost and o.rtt_p99_us >= threshold else 0
            self._change(key, s, -o.sent, -o.lost, -slow)
            if not s.results:
                del self._window[key]
                self._bad.pop(key, None)
                where = s.where
                if where is not None and not self._stale:
                    for h in where.hosts:
                        keys = self._host_keys.get(h)
                        if keys is not None:
                            keys.discard(key)
                            if not keys:
                                del self._host_keys[h]

    def _rebuild(self) -> None:
        """The running sums from the window's keys again (after the wiring changed)."""
        self._stale = False
        self._csent, self._clost, self._cans = {}, {}, {}
        self._psent, self._pans = {}, {}
        self._tsent = self._tlost = 0
        self._host_keys = {}
        answered: list[tuple[int, float, tuple[str, ...]]] = []
        for key, s in self._window.items():
            where = s.where = self._path_of(key)
            if where is None:
                continue
            for h in where.hosts:
                self._host_keys.setdefault(h, set()).add(key)
            self._apply(where, s.sent, s.lost, int(s.answered))
            answered += [(t, o.rtt_p99_us, where.switches) for t, o in s.results if o.sent > o.lost and o.rtt_p99_us]
        self._cworst = {}
        answered.sort(key=lambda a: a[0])  # stable: the order they arrived in, within one ms
        for t, p99, comps in answered:
            self._push_worst(dict.fromkeys(comps, p99), t)

    def set_rtt_threshold(self, threshold_us: float) -> None:
        """A new delay threshold while running (a settings reload; the rail lab sets one from its
        own measured round trips): the window's slow counts are recounted against it, so what
        ages out later is taken out as it was counted."""
        if threshold_us <= 0:
            raise ValueError(f"rtt_threshold_us must be > 0, not {threshold_us}")
        self.config = replace(self.config, rtt_threshold_us=threshold_us)
        for key, s in self._window.items():
            s.slow = sum(1 for _, o in s.results if o.sent > o.lost and o.rtt_p99_us >= threshold_us)
            if s.lost > 0 or s.slow > 0:
                self._bad[key] = None
            else:
                self._bad.pop(key, None)
        self._health = None

    def forget_paths(self) -> None:
        """The fabric's wiring changed: paths are worked out again."""
        self._comps.clear()
        self._switch_addresses = None
        self._switchy = set()
        self._stale = True

    def due(self) -> bool:
        now = self.clock.monotonic()
        if now - self._last_run < self.config.localise_every_s:
            return False
        self._last_run = now
        return True

    # -- localisation ----------------------------------------------------------------------
    def localise(self) -> list[Blame]:
        """The components to blame for what the window holds (no state changes but the window's)."""
        now = self.clock.time_ms()
        horizon = now - int(self.config.localise_window_s * 1000)
        self._expire(horizon)
        if self._stale:
            self._rebuild()
        self._horizon = horizon
        self._health = self._fabric_health = None
        self._excluded = self._excluded_keys(horizon)
        self._judge_background()
        bad = [p for key in self._bad if key not in self._excluded and (p := self._path(key)) is not None]
        if not bad:
            self._judge_delay([])
            return []  # a clean fabric costs the hosts' check
        blames = self._vote(bad, "loss", set())
        explained = {b.component for b in blames}
        slow = [p for p in bad if not explained.intersection(p.comps)]
        self._judge_delay(slow)
        blames += self._vote(slow, "delay", explained)
        return [self._uplink_or_leaf(b) for b in blames]

    def _excluded_keys(self, horizon: int) -> set[tuple[str, str, str]]:
        """Keys with a host whose results do not count now (offline, reconnected, gone quiet)."""
        out: set[tuple[str, str, str]] = set()
        for host, keys in self._host_keys.items():
            if not self.node_ok(host, horizon):
                out |= keys
        return out

    def _path(self, key: tuple[str, str, str]) -> _Path | None:
        """A key's window summed into one result on its path (None off the fabric)."""
        found = self._path_of(key)
        if found is None:
            return None
        s = self._window[key]
        p99 = responder = 0.0
        for _, o in s.results:
            if o.sent > o.lost:
                p99 = max(p99, o.rtt_p99_us)
                responder = max(responder, o.responder_us)
        obs = ProbeObs(key[0], key[1], key[2], s.sent, s.lost, p99, responder, False)
        return _Path(obs, found.comps, found.same_leaf, found.leaf, found.spread)

    def _live(self) -> Iterable[tuple[tuple[str, str, str], _Where]]:
        """Every counted key on the fabric with its path (a full scan: only where a blame needs it)."""
        excluded = self._excluded
        for key, s in self._window.items():
            if s.where is not None and key not in excluded:
                yield key, s.where

    def _path_of(self, key: tuple[str, str, str]) -> _Where | None:
        """The components on a key's path (cached until the wiring changes); None off the fabric."""
        if key in self._comps:
            return self._comps[key]
        fab = self.fabric
        local, peer, via = key
        found: _Where | None = None
        if local in fab and peer in fab and fab.kind(local) == "nic" and fab.kind(peer) == "nic":
            la, lb = fab.leaf_of(local), fab.leaf_of(peer)
            if la is not None and lb is not None:
                a, b = fab.host_of(local), fab.host_of(peer)
                comps = [local, peer, a, la]
                spread: tuple[tuple[str, float], ...] = ()
                pair: tuple[str, str] | None = None
                if b != a:
                    comps.append(b)
                switches = [la]
                if lb != la:
                    comps.append(lb)
                    switches.append(lb)
                    if via and via in fab and fab.kind(via) == "spine":
                        up = [via, fab.link_name(la, via), fab.link_name(lb, via)]
                        comps += up
                        switches += up
                    elif not via:
                        spread = self._spread(la, lb)
                        pair = (la, lb) if spread else None
                self._switchy.update(switches)
                self._switchy.update(c for c, _ in spread)
                found = _Where(tuple(comps), la == lb, la, (a, b), spread, pair, tuple(switches))
        self._comps[key] = found
        return found

    def _spread(self, la: str, lb: str) -> tuple[tuple[str, float], ...]:
        """The spines and cables between two leaves, each with its even share (one tuple per pair)."""
        known = self._spreads.get((la, lb))
        if known is None:
            fab = self.fabric
            spines = [s for s in fab.spines_of(la) if s in fab.spines_of(lb)]
            shares: list[tuple[str, float]] = []
            for s in spines:
                share = 1 / len(spines)
                shares += [(s, share), (fab.link_name(la, s), share), (fab.link_name(lb, s), share)]
            known = self._spreads[(la, lb)] = tuple(shares)
        return known

    def _health_now(self, only: set[str] | None) -> dict[str, dict[str, Any]]:
        """Sent and lost from the running sums; the worst p99 of ``only`` (the fabric's own
        components) from their sliding maxima, of everything (``only`` None) from one pass over the paths."""
        if only is None:
            sent: dict[str, float] = dict(self._csent)
            lost: dict[str, int] = dict(self._clost)
        else:
            csent, clost = self._csent, self._clost
            sent = {c: csent[c] for c in only if c in csent}
            lost = {c: clost[c] for c in only if c in clost}
        pairs: dict[tuple[str, str], float] = dict(self._psent)
        tainted: set[str] = set()
        for key in self._excluded:
            where = self._path_of(key)
            s = self._window.get(key)
            if where is None or s is None:
                continue
            for c in where.comps:
                if c in sent:
                    tainted.add(c)
                    sent[c] -= s.sent
                    if s.lost:
                        lost[c] -= s.lost
            if where.pair is not None:
                pairs[where.pair] -= s.sent
        for pair, total in pairs.items():
            if total:
                for c, share in self._spreads[pair]:
                    sent[c] = sent.get(c, 0.0) + total * share
        worst = self._worst_p99(None if only is None else tainted)
        out: dict[str, dict[str, Any]] = {}
        for c, n in sent.items():
            if n <= 0:
                continue
            miss = lost.get(c, 0)
            out[c] = {
                "kind": self._kind(c),
                "sent": int(n),
                "lost": int(miss),
                "loss": round(miss / n, 5),
                "p99_us": round(worst.get(c, 0.0), 1),
            }
        return out

    def _worst_p99(self, tainted: set[str] | None) -> dict[str, float]:
        """Each component's worst network p99 over the window's counted keys. ``tainted`` None: of
        every component, one pass over the paths; else of the fabric's own from their sliding
        maxima, but for the ``tainted`` ones (crossed by an excluded key) from the counted keys."""
        worst: dict[str, float] = {}
        if tainted is not None:
            horizon = self._expired_to
            for c, dq in list(self._cworst.items()):
                while dq and dq[0][0] < horizon:
                    dq.popleft()
                if not dq:
                    del self._cworst[c]
                elif c not in tainted:
                    worst[c] = dq[0][1]
            if not tainted:
                return worst
        for key, where in self._live():
            hit = where.comps if tainted is None else tainted.intersection(where.switches)
            if not hit:
                continue
            p99 = self._window[key].p99()
            if p99 > 0.0:
                for c in hit:
                    if p99 > worst.get(c, 0.0):
                        worst[c] = p99
        return worst

    def worst(self, limit: int = 10, kinds: tuple[str, ...] = ("link", "leaf", "spine")) -> list[dict[str, Any]]:
        """The most lossy (then slowest) probed components of these kinds, worst first."""
        health = self.fabric_health if set(kinds) <= _FABRIC_KINDS else self.health
        rows = [{"component": c, **h} for c, h in health.items() if h["kind"] in kinds]
        rows.sort(key=lambda r: (-r["loss"], -r["p99_us"], r["component"]))
        return rows[:limit]

    def _denominators(self, what: str, explained: set[str]) -> dict[str, float]:
        """Traffic through each component from the running sums, less the keys that do not count
        (excluded hosts; for the delay vote, paths through what the loss vote already blamed)."""
        loss = what == "loss"
        sent: dict[str, float] = dict(self._csent if loss else self._cans)
        pairs: dict[tuple[str, str], float] = dict(self._psent if loss else self._pans)
        drop = set(self._excluded)
        if explained:
            drop.update(key for key, where in self._live() if explained.intersection(where.comps))
        for key in drop:
            where = self._path_of(key)
            s = self._window.get(key)
            if where is None or s is None:
                continue
            v = s.sent if loss else int(s.answered)
            for c in where.comps:
                sent[c] -= v
            if where.pair is not None:
                pairs[where.pair] -= v
        for pair, total in pairs.items():
            if total:
                for c, share in self._spreads[pair]:
                    sent[c] = sent.get(c, 0.0) + total * share
        return sent

    def _vote(self, paths: list[_Path], what: str, explained: set[str]) -> list[Blame]:
        """Vote over the bad paths; ``explained``: components the loss vote blamed (not counted here)."""
        cfg = self.config
        blames: list[Blame] = []
        min_bad = cfg.min_lost if what == "loss" else 3
        min_rate = cfg.loss_threshold if what == "loss" else 0.5
        bad_paths = [p for p in paths if self._badness(p.obs, what)[0]]
        if not bad_paths:
            return blames
        sent = self._denominators(what, explained)
        tested = sum(1 for v in sent.values() if v > 1e-9)  # the background test's correction
        gone_keys: set[tuple[str, str, str]] = set()
        for _ in range(16):  # at most this many faults named at once
            if not bad_paths:
                break
            lost: dict[str, int] = {}
            for p in bad_paths:
                bad = self._badness(p.obs, what)[0]
                for c in p.comps:
                    lost[c] = lost.get(c, 0) + bad
            suspects = [
                c
                for c, v in lost.items()
                if v >= min_bad and v / max(1, sent[c]) >= min_rate and self._above_background(what, v, sent[c], tested)
            ]
            if not suspects:
                break
            top = max(lost[c] for c in suspects)
            tied = [c for c in suspects if lost[c] >= _TIE * top]
            # On the same rate the evidence cannot tell a NIC (or host) from the switch above it
            # (only that NIC's paths are counted): the switch is named, which takes no node out.
            best = max(tied, key=lambda c: (lost[c] / max(1, sent[c]), lost[c], self._kind(c) not in _NODE_SIDE, c))
            culprits = sorted(
                (p.obs for p in bad_paths if best in p.comps),
                key=lambda o: (-o.lost, -o.rtt_p99_us, o.local_nic, o.peer_nic),
            )
            pairs: list[dict[str, Any]] = [
                {
                    "local": o.local_nic,
                    "peer": o.peer_nic,
                    "via": o.via,
                    "sent": o.sent,
                    "lost": o.lost,
                    "rtt_p99_us": round(o.rtt_p99_us, 1),
                    "responder_us": round(o.responder_us, 1),
                }
                for o in culprits
            ]
            blames.append(Blame(best, self._kind(best), what, lost[best], round(sent[best]), lost[best], pairs))
            # what the blamed component explains leaves the vote, denominators included
            for key, where in self._live():
                if best not in where.comps or key in gone_keys or explained.intersection(where.comps):
                    continue
                gone_keys.add(key)
                s = self._window[key]
                v = s.sent if what == "loss" else int(s.answered)
                for c in where.comps:
                    sent[c] = sent.get(c, 0.0) - v
                for c, share in where.spread:
                    sent[c] = sent.get(c, 0.0) - v * share
            bad_paths = [p for p in bad_paths if best not in p.comps]
        return blames

    def _judge_background(self) -> None:
        """The window's loss over every counted probe: what a component's loss is judged against.
        Logged once as it rises past a fifth of ``loss_threshold`` (and once as it falls back)."""
        sent, lost = self._tsent, self._tlost
        for key in self._excluded:
            s = self._window.get(key)
            if s is not None and s.where is not None:
                sent -= s.sent
                lost -= s.lost
        was = self.background_loss
        now = lost / sent if sent > 0 else None
        self.background_loss = now
        high = self.config.loss_threshold / 5
        if now is not None and now >= high and (was is None or was < high):
            log.warning("probe_background_loss", loss=round(now, 5), sent=sent, lost=lost)
        elif was is not None and was >= high and (now is None or now < high):
            log.info("probe_background_loss_cleared", loss=round(now or 0.0, 5))

    def _judge_delay(self, slow: list[_Path]) -> None:
        """The delay vote's cut: the threshold, or the fabric's own round-trip baseline's outlier
        bound where the whole fabric runs slower (controller.detect.probe_background.delay_baseline).
        Taken only when some path reached the threshold (a fast fabric costs nothing), from at
        most ``DELAY_SAMPLE`` counted paths; logged once as the fabric's baseline moves the cut."""
        threshold = self.config.rtt_threshold_us
        if not any(p.obs.rtt_p99_us >= threshold for p in slow):
            if self.delay_baseline is not None and self.delay_baseline.cut_us > threshold:
                log.info("probe_background_delay_cleared", median_us=round(self.delay_baseline.median_us, 1))
            self._delay_cut, self.delay_baseline = threshold, None
            return
        answered = [
            s for key, s in self._window.items() if s.where is not None and s.answered and key not in self._excluded
        ]
        step = max(1, len(answered) // DELAY_SAMPLE)
        was = self.delay_baseline
        now = self.delay_baseline = delay_baseline([s.p99() for s in answered[::step]], threshold)
        self._delay_cut = now.cut_us
        raised, raised_before = now.cut_us > threshold, was is not None and was.cut_us > threshold
        if raised and not raised_before:
            log.warning(
                "probe_background_delay",
                median_us=round(now.median_us, 1),
                sigma_us=round(now.sigma_us, 1),
                cut_us=round(now.cut_us, 1),
                paths=now.paths,
            )
        elif raised_before and not raised:
            log.info("probe_background_delay_cleared", median_us=round(now.median_us, 1))

    def _above_background(self, what: str, lost: float, sent: float, tested: int) -> bool:
        """Loss through a component stands out from the background at ``background_alpha``, split
        over the components tested; the delay vote keeps its own thresholds."""
        if what != "loss" or not self.background_loss:
            return True
        p = self.config.background_alpha / max(1, tested)
        return stands_out(lost, sent, self.background_loss, p)

    def _badness(self, o: ProbeObs, what: str) -> tuple[int, int]:
        if what == "loss":
            return o.lost, o.sent
        answered = o.sent > o.lost
        return (1 if answered and o.rtt_p99_us >= self._delay_cut else 0), (1 if answered else 0)

    def _kind(self, name: str) -> str:
        if "<->" in name:
            return "link"
        return self.fabric.kind(name)

    def _uplink_or_leaf(self, b: Blame) -> Blame:
        """A leaf whose same-leaf pairs are clean lost its probes above it: an untraced uplink."""
        if b.kind != "leaf":
            return b
        sent = bad = 0
        for key, where in self._live():
            if not (where.same_leaf and where.leaf == b.component):
                continue
            s = self._window[key]
            if b.what == "loss":
                sent += s.sent
                bad += s.lost
            elif s.answered:
                sent += 1
                bad += 1 if s.slow else 0
        if (
            sent >= 50
            and bad / sent < self.config.loss_threshold / 2
            and probe_persist.ring_refutes_leaf(bad, sent, b.rate)
        ):
            b.kind = "path"
            return self._traced_uplink(b) if b.what == "loss" else b
        return b

    def _traced_uplink(self, b: Blame) -> Blame:
        """Of a leaf that loses above it, the uplink its traced lossy flows name, where one stands out.

        On a real fabric a flow's reply may come back over another spine than its probe went
        (ECMP hashes each direction on its own), so a lossy cable's losses also fall on flows
        traced over the leaf's other uplinks, and the leaf out-votes the cable. The traced flows
        through the leaf still lose most on the bad uplink: that uplink is blamed when the loss
        rate of its lossy flows is at least twice that of every other uplink's (and it is
        suspect on its own), else it stays a path fault."""
        fab = self.fabric
        per: dict[str, list[int]] = {}
        for key, where in self._live():
            via = key[2]
            if not via or b.component not in where.comps or where.same_leaf:
                continue
            link = fab.link_name(b.component, via)
            if link not in where.comps:
                continue
            s = self._window[key]
            acc = per.setdefault(link, [0, 0])
            acc[0] += s.sent
            acc[1] += s.lost
        rates = {link: lost / sent for link, (sent, lost) in per.items() if sent}
        if not rates:
            return b
        best = max(rates, key=lambda link: rates[link])
        sent, lost = per[best]
        # only lossy flows are reported alone with their spine: an uplink none of them crossed lost nothing
        others = max((r for link, r in rates.items() if link != best), default=0.0)
        if lost >= self.config.min_lost and rates[best] >= self.config.loss_threshold and rates[best] >= 2 * others:
            return Blame(best, "link", b.what, b.votes, sent, lost, b.pairs)
        return b

    # -- conditions --------------------------------------------------------------------------
    def run(self) -> list[ConditionChange]:
        """One localisation, then what opens, updates and resolves (with persistence and hysteresis)."""
        blames = self.localise()
        self.last_blames = blames
        now = self.clock.time_ms()
        named: dict[tuple[str, str], Blame] = {}
        for b in blames:
            named[(RULE_LOSS if b.what == "loss" else RULE_DELAY, b.component)] = b
        changes: list[ConditionChange] = []
        persist = self.config.persist_windows
        for key, b in named.items():
            self._clean.pop(key, None)
            self._streak[key] = self._streak.get(key, 0) + 1
            kind, run = self._kind_run.get(key, ("", 0))
            run = run + 1 if kind == b.kind else 1
            self._kind_run[key] = (b.kind, run)
            cond = self._open.get(key)
            if cond is not None and probe_persist.replaces(cond.category, b.kind, run, persist):
                cond.resolved_ms = now  # the loss above the leaf was the leaf's own
                changes.append(ConditionChange("resolved", cond))
                cond = self._open[key] = self._condition(key[0], b, now)
                changes.append(ConditionChange("opened", cond))
                log.warning("probe_fault_is_the_leaf", component=b.component, loss=round(b.rate, 4))
            elif cond is not None:
                cond.last_seen_ms = now
                cond.count += 1
                cond.evidence.update(self._evidence(b))
                cond.message = self._message(b)
                changes.append(ConditionChange("updated", cond))
            elif probe_persist.opens(b.kind, self._streak[key], run, persist):
                cond = self._condition(key[0], b, now)
                self._open[key] = cond
                changes.append(ConditionChange("opened", cond))
                log.warning("probe_fault", component=b.component, kind=b.kind, what=b.what, loss=round(b.rate, 4))
        for key in list(self._streak):
            if key not in named:
                del self._streak[key]
                self._kind_run.pop(key, None)
        for key, cond in list(self._open.items()):
            if key in named:
                continue
            self._clean[key] = self._clean.get(key, 0) + 1
            if self._clean[key] >= self.config.clear_windows:
                cond.resolved_ms = now
                del self._open[key]
                del self._clean[key]
                changes.append(ConditionChange("resolved", cond))
        return changes

    def _evidence(self, b: Blame) -> dict[str, Any]:
        return {
            "method": "007 voting over the fabric graph",
            "probe_kind": b.kind,
            "what": b.what,
            "sent": b.sent,
            "lost": b.lost,
            "loss": round(b.rate, 5),
            "votes": round(b.votes, 1),
            "pairs": b.pairs[:10],
            "pairs_total": len(b.pairs),
            "window_s": self.config.localise_window_s,
        }

    @staticmethod
    def _message(b: Blame) -> str:
        if b.what == "loss":
            return f"probes through {b.component} lose {100 * b.rate:.2f}% ({b.lost}/{b.sent}, {len(b.pairs)} pairs)"
        return f"probes through {b.component} are slow ({b.lost} of {b.sent} pairs' p99 over threshold)"

    def _condition(self, rule: str, b: Blame, now: int) -> Condition:
        ctype: ComponentType
        node: str | None = None
        if b.kind == "nic":
            ctype, category, node, action = (
                "nic",
                "nic_errors",
                self.fabric.host_of(b.component),
                vocab.ACTION_CHECK_LINK,
            )
        elif b.kind == "node":
            ctype, category, node, action = "node", "host", b.component, vocab.ACTION_INVESTIGATE
        elif b.kind == "link":
            ctype, category, action = "link", "switch_port", vocab.ACTION_CHECK_LINK
        elif b.kind == "path":
            ctype, category, action = "network", "path", vocab.ACTION_INVESTIGATE
        else:
            ctype, category, action = "switch", "switch", vocab.ACTION_INVESTIGATE
        return Condition(
            # a path on its own rule: the leaf's condition that may replace it is a new condition
            # (grouped afresh into a switch fault), not an update of the path's incident
            rule=f"{rule}{probe_persist.PATH_RULE_SUFFIX}" if b.kind == "path" else rule,
            component=b.component,
            component_type=ctype,
            category=category,
            node=node,
            severity="warning",
            action=action,
            message=self._message(b),
            first_seen_ms=now,
            last_seen_ms=now,
            evidence=self._evidence(b),
        )

    def open_conditions(self) -> Iterable[Condition]:
        return list(self._open.values())
