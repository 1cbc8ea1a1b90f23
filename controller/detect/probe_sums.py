"""The probe window's running sums: what the localiser's vote reads, kept where results arrive.

Why a module of its own: at 10,000 nodes ~14,000 probe results a second arrive, and summing
each one into its path and every component on it cost the controller's one event loop more
than the reports' own decisions (bench/README.md, issue 29, session 12 and 13). So the sums
live where the results are decoded: in each detection shard for its own nodes' reports
(``controller.detect.shard_worker``), or in the controller without shards. The localiser
(``controller.detect.probes``) asks every holder, once per localisation, for a
``SumsSnapshot`` (per component, not per result) and merges them; only when the merged
first round of the vote finds a suspect does it ask for the detail of the keys through the
components that can still be blamed (``keys_through``). A holder keeps its window
unchanged between the two questions (``hold``/``release``): results that arrive meanwhile
wait, so the detail matches the sums it completes.

Each key is (local NIC, peer NIC, via) and is held by one holder only: the reporting node's
(a node's reports go to one shard). Sums over keys therefore merge by addition, and the
sliding maxima by max.
"""

from __future__ import annotations

import zlib
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import NamedTuple, TypeVar

from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.v1 import telemetry_pb2 as tpb

Key = tuple[str, str, str]
Pair = tuple[str, str]
_K = TypeVar("_K")
_FABRIC_KINDS = frozenset({"leaf", "spine", "link"})  # what fabric_health holds


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


class Where(NamedTuple):
    """A key's path on the fabric."""

    comps: tuple[str, ...]
    same_leaf: bool
    leaf: str
    hosts: tuple[str, str]
    # Leaf-spine cables a result summed over its flows (no spine named) crossed in even shares:
    # they count towards those cables' traffic (the denominators), never their votes.
    spread: tuple[tuple[str, float], ...]
    pair: Pair | None  # the leaf pair a summed (untraced) result spreads over
    switches: tuple[str, ...] = ()  # of comps, the fabric's own: leaves, the spine, leaf-spine cables


class ProbePaths:
    """Each key's components on the fabric, cached until the wiring changes (both ends use it)."""

    def __init__(self, fabric: Fabric) -> None:
        self.fabric = fabric
        self._comps: dict[Key, Where | None] = {}
        self.spreads: dict[Pair, tuple[tuple[str, float], ...]] = {}  # leaf pair -> shares
        self._switch_addresses: dict[str, str] | None = None  # a traced flow's spine address -> its name
        self._switches: frozenset[str] | None = None  # leaves and spines

    def forget(self, fabric: Fabric | None = None) -> None:
        """The wiring changed (or a new copy of the fabric came): paths are worked out again."""
        if fabric is not None:
            self.fabric = fabric
        self._comps.clear()
        self._switch_addresses = None
        self._switches = None

    def kind(self, name: str) -> str:
        if "<->" in name:
            return "link"
        return self.fabric.kind(name)

    def of_fabric(self, name: str) -> bool:
        """A leaf, a spine or a cable (a NIC's cable never carries probe sums: only leaf-spine ones)."""
        if self._switches is None:
            self._switches = frozenset(self.fabric.switches())
        return name in self._switches or "<->" in name

    def switch_at(self, address: str) -> str:
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

    def of(self, key: Key) -> Where | None:
        """The components on a key's path (cached until the wiring changes); None off the fabric."""
        if key in self._comps:
            return self._comps[key]
        fab = self.fabric
        local, peer, via = key
        found: Where | None = None
        if local in fab and peer in fab and fab.kind(local) == "nic" and fab.kind(peer) == "nic":
            la, lb = fab.leaf_of(local), fab.leaf_of(peer)
            if la is not None and lb is not None:
                a, b = fab.host_of(local), fab.host_of(peer)
                comps = [local, peer, a, la]
                spread: tuple[tuple[str, float], ...] = ()
                pair: Pair | None = None
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
                        spread = self.spread(la, lb)
                        pair = (la, lb) if spread else None
                found = Where(tuple(comps), la == lb, la, (a, b), spread, pair, tuple(switches))
        self._comps[key] = found
        return found

    def spread(self, la: str, lb: str) -> tuple[tuple[str, float], ...]:
        """The spines and cables between two leaves, each with its even share (one tuple per pair)."""
        known = self.spreads.get((la, lb))
        if known is None:
            fab = self.fabric
            spines = [s for s in fab.spines_of(la) if s in fab.spines_of(lb)]
            shares: list[tuple[str, float]] = []
            for s in spines:
                share = 1 / len(spines)
                shares += [(s, share), (fab.link_name(la, s), share), (fab.link_name(lb, s), share)]
            known = self.spreads[(la, lb)] = tuple(shares)
        return known


class SumsRequest(NamedTuple):
    """What the localiser asks every holder at a localisation."""

    now_ms: int
    horizon_ms: int  # results received before it have aged out
    excluded: frozenset[str]  # hosts whose results do not count now (offline, reconnected, quiet)
    rtt_threshold_us: float


class SumsSnapshot(NamedTuple):
    """One holder's window over its counted keys (excluded hosts' keys taken out), per component.

    ``csent``/``clost``: probes through each component (loss denominators; ``clost`` is also
    each component's loss vote, every key that lost being a bad one); ``cans``: answered keys
    through it (delay denominators); ``psent``/``pans``: the same of the untraced keys per leaf
    pair, spread over its spines by the localiser; ``slow``: keys whose p99 reached the delay
    threshold, through each component (the delay vote); ``worst``: each fabric component's
    (leaf, spine, cable) worst network p99. A copy leaves zero entries out."""

    tsent: int
    tlost: int
    csent: dict[str, int]
    clost: dict[str, int]
    cans: dict[str, int]
    psent: dict[Pair, int]
    pans: dict[Pair, int]
    slow: dict[str, int]
    worst: dict[str, float]
    slow_keys: int = 0  # counted keys with an answered result whose p99 reached the threshold
    answered_keys: int = 0  # counted keys answered (the delay baseline's population)


class KeyRecord(NamedTuple):
    """One counted key's window summed into one result (what the vote's later rounds read): its
    probes sent and lost, the worst network p99 and responder time of its answered results."""

    local_nic: str
    peer_nic: str
    via: str
    sent: int
    lost: int
    rtt_p99_us: float
    responder_us: float
    slow: int  # of its answered results, those whose p99 reached the delay threshold


class _Sums:
    """One key's window, summed as results arrive and expire: what the vote needs without a pass."""

    __slots__ = ("answered", "lost", "results", "sent", "slow", "where")

    def __init__(self, where: Where | None) -> None:
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


class ProbeSums:
    """The running sums of one holder's keys (every key without shards, a shard's nodes' with them).

    Every result is added to its key's sums and to the running traffic of each component on
    the key's path as it arrives, and taken out as it leaves the window (a global arrival
    queue, so expiry touches only what expires). Each fabric component's worst p99 is a
    sliding-window maximum (a deque of falling round trips, filled as results arrive,
    trimmed as they age). A snapshot is then per component, not per result."""

    def __init__(self, fabric: Fabric, config: ProbeConfig, paths: ProbePaths | None = None) -> None:
        self.config = config
        self.paths = paths if paths is not None else ProbePaths(fabric)
        self._window: dict[Key, _Sums] = {}
        self._arrivals: deque[tuple[int, Key]] = deque()  # every result, oldest first
        self._bad: dict[Key, None] = {}  # keys whose window lost or was slow (ordered set)
        self._csent: dict[str, int] = {}
        self._clost: dict[str, int] = {}
        self._cans: dict[str, int] = {}
        self._psent: dict[Pair, int] = {}
        self._pans: dict[Pair, int] = {}
        self._tsent = self._tlost = 0  # every key on the fabric: the background's sums
        self._tans = 0  # answered keys on the fabric
        self._host_keys: dict[str, set[Key]] = {}
        self._stale = False  # the wiring changed: the running sums are rebuilt at the next snapshot
        self._excluded: set[Key] = set()  # the last snapshot's
        # fabric component -> (received ms, p99) of the window's answered results through it, p99
        # falling from the front: the front is its worst p99 once the aged-out ones are trimmed
        self._cworst: dict[str, deque[tuple[int, float]]] = {}
        self._expired_to = 0  # the horizon of the latest expiry: results before it are gone
        self._held: list[tuple[int, list[ProbeObs]]] | None = None  # results waiting while held

    def __len__(self) -> int:
        """Keys in the window."""
        return len(self._window)

    def empty(self) -> bool:
        return not self._window and not self._arrivals and not self._bad

    # -- input ---------------------------------------------------------------------------
    def add(self, now: int, obs: Iterable[ProbeObs]) -> None:
        """A report's results received at ``now`` (ms); a restarted peer's are left out."""
        if self._held is not None:
            self._held.append((now, list(obs)))
            return
        # what aged out goes as reports come, a little each time, not all at the localisation
        self._expire(now - int(self.config.localise_window_s * 1000))
        threshold = self.config.rtt_threshold_us
        paths = self.paths
        fabric = paths.fabric
        peaks: dict[str, float] = {}  # each fabric component's worst p99 in this report (one arrival time)
        for given in obs:
            if given.restarted:
                continue
            o = given
            if o.via and o.via not in fabric:  # a traced flow names its spine by address
                o = given._replace(via=paths.switch_at(given.via))
            key = (o.local_nic, o.peer_nic, o.via)
            s = self._window.get(key)
            if s is None:
                where = paths.of(key)
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

    def hold(self) -> None:
        """Keep the window as it is until ``release``: results that arrive wait (a localisation
        asks its second question of the window it asked its first)."""
        if self._held is None:
            self._held = []

    def release(self) -> None:
        held, self._held = self._held, None
        for now, obs in held or ():
            self.add(now, obs)

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

    def _change(self, key: Key, s: _Sums, sent: int, lost: int, slow: int) -> None:
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
        self._tans += int(s.answered) - int(was)
        self._apply(where, sent, lost, int(s.answered) - int(was))

    def _apply(self, where: Where, sent: int, lost: int, ans: int) -> None:
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
        self._tans = 0
        self._host_keys = {}
        answered: list[tuple[int, float, tuple[str, ...]]] = []
        for key, s in self._window.items():
            where = s.where = self.paths.of(key)
            if where is None:
                continue
            for h in where.hosts:
                self._host_keys.setdefault(h, set()).add(key)
            self._tans += int(s.answered)
            self._apply(where, s.sent, s.lost, int(s.answered))
            answered += [(t, o.rtt_p99_us, where.switches) for t, o in s.results if o.sent > o.lost and o.rtt_p99_us]
        self._cworst = {}
        answered.sort(key=lambda a: a[0])  # stable: the order they arrived in, within one ms
        for t, p99, comps in answered:
            self._push_worst(dict.fromkeys(comps, p99), t)

    def set_rtt_threshold(self, threshold_us: float) -> None:
        """A new delay threshold: the window's slow counts are recounted against it, so what
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

    def forget_paths(self, fabric: Fabric | None = None) -> None:
        """The fabric's wiring changed (``fabric``: a new copy of it, in a shard): paths are
        worked out again and the running sums rebuilt at the next snapshot."""
        self.paths.forget(fabric)
        self._stale = True

    # -- the localiser's questions -------------------------------------------------------
    def snapshot(self, req: SumsRequest, *, copy: bool = True) -> SumsSnapshot:
        """The window at ``req``'s horizon over the counted keys, per component.

        ``copy`` False (the localiser that holds this window itself, which reads the snapshot at
        once): with no host excluded the running sums themselves, not copies of them (zero
        entries included): a clean localisation then costs no pass over the components."""
        if req.rtt_threshold_us != self.config.rtt_threshold_us:
            self.set_rtt_threshold(req.rtt_threshold_us)
        self._expire(req.horizon_ms)
        if self._stale:
            self._rebuild()
        excluded: set[Key] = set()
        for host in req.excluded:
            keys = self._host_keys.get(host)
            if keys:
                excluded |= keys
        self._excluded = excluded
        if not excluded and not copy:
            slow, slow_keys = self._slow_votes(excluded)
            return SumsSnapshot(
                self._tsent,
                self._tlost,
                self._csent,
                self._clost,
                self._cans,
                self._psent,
                self._pans,
                slow,
                self._worst(set()),
                slow_keys,
                self._tans,
            )
        if 2 * len(excluded) > len(self._window):
            return self._counted(excluded)  # most hosts out (every node just connected): sum the rest
        csent, clost, cans = dict(self._csent), dict(self._clost), dict(self._cans)
        psent, pans = dict(self._psent), dict(self._pans)
        tsent, tlost, tans = self._tsent, self._tlost, self._tans
        tainted: set[str] = set()
        window = self._window
        for key in excluded:
            s = window[key]
            where = s.where
            if where is None:
                continue
            ans = int(s.answered)
            tsent -= s.sent
            tlost -= s.lost
            tans -= ans
            for c in where.comps:
                csent[c] -= s.sent
                if s.lost:
                    clost[c] -= s.lost
                if ans:
                    cans[c] -= ans
            tainted.update(where.switches)
            if where.pair is not None:
                psent[where.pair] -= s.sent
                if ans:
                    pans[where.pair] -= ans
        slow, slow_keys = self._slow_votes(excluded)
        return SumsSnapshot(
            tsent,
            tlost,
            _nonzero(csent),
            _nonzero(clost),
            _nonzero(cans),
            _nonzero(psent),
            _nonzero(pans),
            slow,
            self._worst(tainted),
            slow_keys,
            tans,
        )

    def _counted(self, excluded: set[Key]) -> SumsSnapshot:
        """The snapshot summed from the counted keys alone (cheaper than taking most keys out of the
        running sums: after a controller start every host is excluded for one window)."""
        csent: dict[str, int] = {}
        clost: dict[str, int] = {}
        cans: dict[str, int] = {}
        psent: dict[Pair, int] = {}
        pans: dict[Pair, int] = {}
        worst: dict[str, float] = {}
        tsent = tlost = tans = 0
        for key, where in self._live():
            s = self._window[key]
            ans = int(s.answered)
            tsent += s.sent
            tlost += s.lost
            tans += ans
            for c in where.comps:
                csent[c] = csent.get(c, 0) + s.sent
                if s.lost:
                    clost[c] = clost.get(c, 0) + s.lost
                if ans:
                    cans[c] = cans.get(c, 0) + ans
            if where.pair is not None:
                psent[where.pair] = psent.get(where.pair, 0) + s.sent
                if ans:
                    pans[where.pair] = pans.get(where.pair, 0) + ans
            p99 = s.p99()  # the worst of a counted key's answered results: every key through it is counted here
            if p99 > 0.0:
                for c in where.switches:
                    if p99 > worst.get(c, 0.0):
                        worst[c] = p99
        self._worst(set())  # the sliding maxima trimmed as a snapshot always does
        slow, slow_keys = self._slow_votes(excluded)
        return SumsSnapshot(
            tsent,
            tlost,
            _nonzero(csent),
            _nonzero(clost),
            _nonzero(cans),
            _nonzero(psent),
            _nonzero(pans),
            slow,
            worst,
            slow_keys,
            tans,
        )

    def _slow_votes(self, excluded: set[Key]) -> tuple[dict[str, int], int]:
        """The delay vote's first round: counted answered keys whose p99 reached the threshold, per
        component; and how many counted keys have a result that did (answered or not)."""
        slow: dict[str, int] = {}
        slow_keys = 0
        window = self._window
        for key in self._bad:
            if key in excluded:
                continue
            s = window[key]
            if s.where is not None and s.slow > 0:
                slow_keys += 1
                if s.answered:
                    for c in s.where.comps:
                        slow[c] = slow.get(c, 0) + 1
        return slow, slow_keys

    def _worst(self, tainted: set[str]) -> dict[str, float]:
        """Each fabric component's worst network p99 over the counted keys: from the sliding
        maxima, but for the ``tainted`` ones (crossed by an excluded key) from the counted keys."""
        worst: dict[str, float] = {}
        horizon = self._expired_to
        for c, dq in list(self._cworst.items()):
            while dq and dq[0][0] < horizon:
                dq.popleft()
            if not dq:
                del self._cworst[c]
            elif c not in tainted:
                worst[c] = dq[0][1]
        if tainted:
            for key, where in self._live():
                hit = tainted.intersection(where.switches)
                if not hit:
                    continue
                p99 = self._window[key].p99()
                if p99 > 0.0:
                    for c in hit:
                        if p99 > worst.get(c, 0.0):
                            worst[c] = p99
        return worst

    def worst_all(self) -> dict[str, float]:
        """Every component's worst network p99 over the last snapshot's counted keys (NICs and
        hosts too: one pass over the keys; nothing on the serving path asks it)."""
        worst: dict[str, float] = {}
        for key, where in self._live():
            p99 = self._window[key].p99()
            if p99 > 0.0:
                for c in where.comps:
                    if p99 > worst.get(c, 0.0):
                        worst[c] = p99
        return worst

    def delay_sample(self, every: int) -> list[float]:
        """The worst p99 of the counted answered keys, of one key in ``every`` chosen by a hash of
        the key (the same keys whoever holds them): the delay baseline's sample."""
        if every <= 1:
            return [self._window[key].p99() for key, _ in self._live() if self._window[key].answered]
        out: list[float] = []
        for key, _ in self._live():
            s = self._window[key]
            if s.answered and zlib.crc32(f"{key[0]}|{key[1]}|{key[2]}".encode()) % every == 0:
                out.append(s.p99())
        return out

    def keys_through(self, comps: frozenset[str]) -> list[KeyRecord]:
        """Every counted key whose path crosses one of ``comps``, summed (the last snapshot's window)."""
        if not comps:
            return []
        excluded = self._excluded
        out: list[KeyRecord] = []
        for key, s in self._window.items():
            where = s.where
            if where is None or comps.isdisjoint(where.comps) or key in excluded:
                continue
            p99 = responder = 0.0
            for _, o in s.results:
                if o.sent > o.lost:
                    p99 = max(p99, o.rtt_p99_us)
                    responder = max(responder, o.responder_us)
            out.append(KeyRecord(key[0], key[1], key[2], s.sent, s.lost, p99, responder, s.slow))
        return out

    def _live(self) -> Iterable[tuple[Key, Where]]:
        """Every counted key on the fabric with its path (a full scan: only where a blame needs it)."""
        excluded = self._excluded
        for key, s in self._window.items():
            if s.where is not None and key not in excluded:
                yield key, s.where


def _nonzero(sums: dict[_K, int]) -> dict[_K, int]:
    return {k: v for k, v in sums.items() if v}


def fabric_kind(kind: str) -> bool:
    """Whether a component of this kind is one of the fabric's own (what the topology view shows)."""
    return kind in _FABRIC_KINDS
