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

Inputs are observations decoded and summed where the reports are decided (the window's
running sums, ``controller.detect.probe_sums``: in this process, or in each detection shard
for its own nodes), merged here per component at each localisation, since only the
controller votes with the whole fabric. Observations involving a node that is not online,
re-registered within the window, or whose responder restarted (``peer_restarted``) are left
out: a peer's restart or drain is not a network fault.

No cry wolf: a component needs ``min_lost`` lost probes and ``loss_threshold`` loss over the
window, and its losses must stand out from the fabric's background (the window's loss over
every counted probe) at ``background_alpha`` (controller.detect.probe_background): an even
background loss is one fabric-wide finding (``background_loss``), not a fault per NIC. It
becomes a condition after ``persist_windows`` localisations in a row name it, and resolves
after ``clear_windows`` in a row do not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

import structlog

from controller.detect import probe_persist
from controller.detect.model import ComponentType, Condition, ConditionChange
from controller.detect.probe_background import DELAY_SAMPLE, DelayBaseline, delay_baseline, stands_out
from controller.detect.probe_sums import (
    KeyRecord,
    Pair,
    ProbeObs,
    ProbePaths,
    ProbeSums,
    SumsRequest,
    SumsSnapshot,
    Where,
    fabric_kind,
    observations,
)
from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core import vocab
from starpulse.core.clock import Clock

log = structlog.get_logger(__name__)

_TIE = 0.9  # votes within 10 % of the most are a tie
_NODE_SIDE = frozenset({"nic", "node", "gpu"})  # components whose blame takes a node out
RULE_LOSS = "probe.loss"
RULE_DELAY = "probe.delay"
__all__ = ["Blame", "ProbeLocaliser", "ProbeObs", "observations"]


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
    """A counted key's window summed into one result, on its path."""

    obs: KeyRecord
    where: Where
    comps: tuple[str, ...]  # the path's (a field, not a property: the vote reads it in its loops)


_EMPTY = SumsSnapshot(0, 0, {}, {}, {}, {}, {}, {}, {}, 0, 0)


class KeysQuestion(NamedTuple):
    """The localisation's second question: the keys through ``comps``, and where the delay vote
    needs the fabric's baseline, a sample of one answered key in ``every`` (0: none)."""

    comps: frozenset[str]
    every: int


def merge(snapshots: Iterable[SumsSnapshot]) -> SumsSnapshot:
    """The holders' snapshots as one, the whole window over the counted keys (each key is one
    holder's: sums add, maxima take the max; one holder's is taken as it is)."""
    if isinstance(snapshots, list) and len(snapshots) == 1:
        return snapshots[0]
    tsent = tlost = slow_keys = answered_keys = 0
    csent: dict[str, int] = {}
    clost: dict[str, int] = {}
    cans: dict[str, int] = {}
    psent: dict[Pair, int] = {}
    pans: dict[Pair, int] = {}
    slow: dict[str, int] = {}
    worst: dict[str, float] = {}
    for snap in snapshots:
        tsent += snap.tsent
        tlost += snap.tlost
        slow_keys += snap.slow_keys
        answered_keys += snap.answered_keys
        for into, part in ((csent, snap.csent), (clost, snap.clost), (cans, snap.cans), (slow, snap.slow)):
            if not into:
                into.update(part)
                continue
            for c, v in part.items():
                into[c] = into.get(c, 0) + v
        for pinto, ppart in ((psent, snap.psent), (pans, snap.pans)):
            for p, v in ppart.items():
                pinto[p] = pinto.get(p, 0) + v
        for c, w in snap.worst.items():
            if w > worst.get(c, 0.0):
                worst[c] = w
    return SumsSnapshot(tsent, tlost, csent, clost, cans, psent, pans, slow, worst, slow_keys, answered_keys)


class ProbeLocaliser:
    """Turns the window's sums into blames and conditions (see the module docstring).

    The window itself is held where the results arrive (``controller.detect.probe_sums``): in
    this object's own ``ProbeSums`` without detection shards (``add``), in each shard with
    them. A localisation asks every holder for its snapshot (``request``, then ``merge``: per
    component, not per result), and only when the merged vote's first round has a suspect
    asks for the detail of the keys through the components that can still be blamed
    (``needs``, then ``conclude``); ``localise`` does both rounds with its own sums at once,
    the controller's Detection over the shard wire (off the event loop's critical path).
    Why exact: a component is only ever a suspect with at least ``min_lost`` lost (or 3 slow)
    votes, and votes only fall as blamed components take their keys out, so the keys through
    the components that have that many votes in the merged first round are every key the
    vote, its denominators' corrections, its evidence and the leaf checks ever read.
    ``fabric_health`` (the topology view) and ``health`` come from the merged snapshot.
    """

    def __init__(
        self,
        fabric: Fabric,
        config: ProbeConfig,
        *,
        clock: Clock,
        node_ok: Callable[[str, int], bool] = lambda node, since_ms: True,
        local: bool = True,
    ) -> None:
        """``node_ok(node, since_ms)``: the node is online and was connected before ``since_ms``.
        ``local``: this localiser holds the window itself (False: detection shards hold it)."""
        self.fabric = fabric
        self.config = config
        self.clock = clock
        self.node_ok = node_ok
        self.paths = ProbePaths(fabric)
        self.sums: ProbeSums | None = ProbeSums(fabric, config, self.paths) if local else None
        self._streak: dict[tuple[str, str], int] = {}  # (rule, component) -> localisations in a row
        self._kind_run: dict[tuple[str, str], tuple[str, int]] = {}  # -> (kind, in a row as that kind)
        self._clean: dict[tuple[str, str], int] = {}
        self._open: dict[tuple[str, str], Condition] = {}
        self._last_run = clock.monotonic()
        self.last_blames: list[Blame] = []
        self.background_loss: float | None = None  # the last localisation's, None without traffic
        # the fabric's round-trip baseline, taken when a localisation has slow paths to vote on
        self.delay_baseline: DelayBaseline | None = None
        self._delay_cut = config.rtt_threshold_us  # what a path's p99 must reach to vote slow
        self._merged = _EMPTY
        self._base: dict[str, dict[str, float]] = {}  # "loss"/"delay" -> denominators, nothing explained
        self._health: dict[str, dict[str, Any]] | None = None
        self._fabric_health: dict[str, dict[str, Any]] | None = None

    @property
    def health(self) -> dict[str, dict[str, Any]]:
        """Every probed component's health over the last localisation's window: kind, sent, lost,
        loss share, the worst network p99 (of NICs and hosts only where this localiser holds the
        window: a pass over every key; nothing on the serving path reads it)."""
        if self._health is None:
            worst = self.sums.worst_all() if self.sums is not None else self._merged.worst
            self._health = self._health_now(False, worst)
        return self._health

    @property
    def fabric_health(self) -> dict[str, dict[str, Any]]:
        """``health`` of the fabric's own components (leaves, spines, leaf-spine cables): what the
        topology view shows (the dashboard's colours, the CLI's worst links), from the merged sums."""
        if self._fabric_health is None:
            self._fabric_health = self._health_now(True, self._merged.worst)
        return self._fabric_health

    # -- input (without shards) ----------------------------------------------------------
    def add(self, node: str, obs: list[ProbeObs]) -> None:
        """A report's results into this localiser's own window; a restarted peer's are left out."""
        if self.sums is None:
            raise RuntimeError("this localiser's window is held by the detection shards")
        self.sums.add(self.clock.time_ms(), obs)

    def set_rtt_threshold(self, threshold_us: float) -> None:
        """A new delay threshold while running (a settings reload; the rail lab sets one from its
        own measured round trips): the window's slow counts are recounted against it, so what
        ages out later is taken out as it was counted (shards at their next snapshot)."""
        if threshold_us <= 0:
            raise ValueError(f"rtt_threshold_us must be > 0, not {threshold_us}")
        self.config = replace(self.config, rtt_threshold_us=threshold_us)
        if self.sums is not None:
            self.sums.set_rtt_threshold(threshold_us)
        self._health = None

    def forget_paths(self) -> None:
        """The fabric's wiring changed: paths are worked out again (by every holder)."""
        self.paths.forget()
        if self.sums is not None:
            self.sums.forget_paths()

    def due(self) -> bool:
        now = self.clock.monotonic()
        if now - self._last_run < self.config.localise_every_s:
            return False
        self._last_run = now
        return True

    # -- localisation ----------------------------------------------------------------------
    def localise(self) -> list[Blame]:
        """The components to blame for what this localiser's own window holds (both rounds at once)."""
        if self.sums is None:
            raise RuntimeError("this localiser's window is held by the detection shards")
        sums = self.sums
        question = self.merge([sums.snapshot(self.request(), copy=False)])
        if question is None:
            return self.conclude([], [])
        sample = sums.delay_sample(question.every) if question.every else []
        return self.conclude(sums.keys_through(question.comps), sample)

    def request(self) -> SumsRequest:
        """The first question for every holder: the window's horizon and the hosts not counted now."""
        now = self.clock.time_ms()
        horizon = now - int(self.config.localise_window_s * 1000)
        excluded = frozenset(h for h in self.fabric.nodes() if not self.node_ok(h, horizon))
        return SumsRequest(now, horizon, excluded, self.config.rtt_threshold_us)

    def merge(self, snapshots: Iterable[SumsSnapshot]) -> KeysQuestion | None:
        """The holders' answers to ``request``: the background judged, and the second question:
        the components whose keys' detail the vote needs, and whether it needs the delay
        baseline's sample (None: nothing can be blamed and nothing is slow, no second question)."""
        m = self._merged = merge(snapshots)
        self._health = self._fabric_health = None
        self._base = {}
        self._judge_background(m)
        cfg = self.config
        loss = {c for c, v in m.clost.items() if v >= cfg.min_lost}
        slow = {c for c, v in m.slow.items() if v >= 3}
        every = max(1, m.answered_keys // DELAY_SAMPLE) if m.slow_keys else 0
        if not self._suspects(loss, m.clost, "loss") and not self._suspects(slow, m.slow, "delay"):
            return KeysQuestion(frozenset(), every) if every else None
        return KeysQuestion(frozenset(loss | slow), every)

    def _suspects(self, candidates: set[str], votes: dict[str, int], what: str) -> bool:
        """Whether the vote's first round (nothing explained yet) has a suspect among ``candidates``."""
        if not candidates:
            return False
        sent = self._base[what] = self._denominators(what, set(), [])
        tested = sum(1 for v in sent.values() if v > 1e-9)
        min_rate = self.config.loss_threshold if what == "loss" else 0.5
        return any(
            votes[c] / max(1, sent.get(c, 0.0)) >= min_rate
            and self._above_background(what, votes[c], sent.get(c, 0.0), tested)
            for c in candidates
        )

    def conclude(self, records: Iterable[KeyRecord], sample: list[float]) -> list[Blame]:
        """The vote over the merged sums and the holders' answers to ``merge``'s question: the keys'
        detail, and the delay baseline's sample."""
        paths: list[_Path] = []
        for r in records:
            where = self.paths.of((r.local_nic, r.peer_nic, r.via))
            if where is not None:
                paths.append(_Path(r, where, where.comps))
        bad = [p for p in paths if p.obs.lost > 0 or p.obs.slow > 0]
        blames = self._vote(bad, paths, "loss", set()) if bad else []
        explained = {b.component for b in blames}
        # a key slow at the threshold outside what the loss vote explained (those through it were all sent)
        slow_explained = sum(1 for p in paths if p.obs.slow > 0 and not explained.isdisjoint(p.comps))
        self._judge_delay(self._merged.slow_keys > slow_explained, sample)
        if not bad:
            return []
        slow = [p for p in bad if not explained.intersection(p.comps)]
        blames += self._vote(slow, paths, "delay", explained)
        return [self._uplink_or_leaf(b, paths) for b in blames]

    def _health_now(self, fabric_only: bool, worst: dict[str, float]) -> dict[str, dict[str, Any]]:
        """Sent and lost per component from the merged sums (the untraced keys' traffic spread
        over each leaf pair's spines and cables), and each one's worst network p99."""
        m = self._merged
        sent: dict[str, float]
        if fabric_only:
            of_fabric = self.paths.of_fabric
            sent = {c: through for c, through in m.csent.items() if of_fabric(c)}
        else:
            sent = dict(m.csent)
        spread = self.paths.spread
        for pair, total in m.psent.items():
            for c, share in spread(*pair):
                sent[c] = sent.get(c, 0.0) + total * share
        out: dict[str, dict[str, Any]] = {}
        for c, n in sent.items():
            if n <= 0:
                continue
            miss = m.clost.get(c, 0)
            out[c] = {
                "kind": self._kind(c),
                "sent": int(n),
                "lost": int(miss),
                "loss": round(miss / n, 5),
                "p99_us": round(worst.get(c, 0.0), 1),
            }
        return out

    def worst(self, limit: int = 10, kinds: tuple[str, ...] = ("link", "leaf", "spine")) -> list[dict[str, Any]]:
        """The most lossy (then slowest) probed components of these kinds, worst first."""
        health = self.fabric_health if all(fabric_kind(k) for k in kinds) else self.health
        rows = [{"component": c, **h} for c, h in health.items() if h["kind"] in kinds]
        rows.sort(key=lambda r: (-r["loss"], -r["p99_us"], r["component"]))
        return rows[:limit]

    def _denominators(self, what: str, explained: set[str], paths: list[_Path]) -> dict[str, float]:
        """Traffic through each component from the merged sums (excluded hosts already out), less,
        for the delay vote, the keys through what the loss vote already blamed."""
        m = self._merged
        loss = what == "loss"
        sent: dict[str, float] = dict(m.csent if loss else m.cans)
        pairs: dict[Pair, float] = dict(m.psent if loss else m.pans)
        if explained:
            for p in paths:
                where = p.where
                if explained.isdisjoint(where.comps):
                    continue
                v = p.obs.sent if loss else int(p.obs.sent > p.obs.lost)
                for c in where.comps:
                    sent[c] = sent.get(c, 0.0) - v
                if where.pair is not None:
                    pairs[where.pair] = pairs.get(where.pair, 0.0) - v
        spread = self.paths.spread
        for pair, total in pairs.items():
            if total:
                for c, share in spread(*pair):
                    sent[c] = sent.get(c, 0.0) + total * share
        return sent

    def _vote(self, paths: list[_Path], live: list[_Path], what: str, explained: set[str]) -> list[Blame]:
        """Vote over the bad paths; ``live``: every key the holders sent (the bad ones among them);
        ``explained``: components the loss vote blamed (not counted here)."""
        cfg = self.config
        blames: list[Blame] = []
        min_bad = cfg.min_lost if what == "loss" else 3
        min_rate = cfg.loss_threshold if what == "loss" else 0.5
        bad_paths = [p for p in paths if self._badness(p, what)]
        if not bad_paths:
            return blames
        base = None if explained else self._base.get(what)
        sent = dict(base) if base is not None else self._denominators(what, explained, live)
        tested = sum(1 for v in sent.values() if v > 1e-9)  # the background test's correction
        gone_keys: set[int] = set()
        for _ in range(16):  # at most this many faults named at once
            if not bad_paths:
                break
            lost: dict[str, int] = {}
            for p in bad_paths:
                bad = self._badness(p, what)
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
                key=lambda o: (-o.lost, -o.rtt_p99_us, o.local_nic, o.peer_nic, o.via),
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
            for i, p in enumerate(live):
                where = p.where
                if best not in where.comps or i in gone_keys or explained.intersection(where.comps):
                    continue
                gone_keys.add(i)
                v = p.obs.sent if what == "loss" else int(p.obs.sent > p.obs.lost)
                for c in where.comps:
                    sent[c] = sent.get(c, 0.0) - v
                for c, share in where.spread:
                    sent[c] = sent.get(c, 0.0) - v * share
            bad_paths = [p for p in bad_paths if best not in p.comps]
        return blames

    def _judge_background(self, m: SumsSnapshot) -> None:
        """The window's loss over every counted probe: what a component's loss is judged against.
        Logged once as it rises past a fifth of ``loss_threshold`` (and once as it falls back)."""
        sent, lost = m.tsent, m.tlost
        was = self.background_loss
        now = lost / sent if sent > 0 else None
        self.background_loss = now
        high = self.config.loss_threshold / 5
        if now is not None and now >= high and (was is None or was < high):
            log.warning("probe_background_loss", loss=round(now, 5), sent=sent, lost=lost)
        elif was is not None and was >= high and (now is None or now < high):
            log.info("probe_background_loss_cleared", loss=round(now or 0.0, 5))

    def _judge_delay(self, slow: bool, sample: list[float]) -> None:
        """The delay vote's cut: the threshold, or the fabric's own round-trip baseline's outlier
        bound where the whole fabric runs slower (controller.detect.probe_background.delay_baseline).
        Taken only when some path (``slow``) reached the threshold (a fast fabric costs nothing),
        from ``sample``: about ``DELAY_SAMPLE`` counted answered paths, chosen by a hash of the key
        (``ProbeSums.delay_sample``: the same paths whoever holds them), every one where there are
        fewer; logged once as the fabric's baseline moves the cut."""
        threshold = self.config.rtt_threshold_us
        if not slow:
            if self.delay_baseline is not None and self.delay_baseline.cut_us > threshold:
                log.info("probe_background_delay_cleared", median_us=round(self.delay_baseline.median_us, 1))
            self._delay_cut, self.delay_baseline = threshold, None
            return
        was = self.delay_baseline
        now = self.delay_baseline = delay_baseline(sample, threshold)
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

    def _badness(self, p: _Path, what: str) -> int:
        o = p.obs
        if what == "loss":
            return o.lost
        return 1 if o.sent > o.lost and o.rtt_p99_us >= self._delay_cut else 0

    def _kind(self, name: str) -> str:
        return self.paths.kind(name)

    def _uplink_or_leaf(self, b: Blame, live: list[_Path]) -> Blame:
        """A leaf whose same-leaf pairs are clean lost its probes above it: an untraced uplink."""
        if b.kind != "leaf":
            return b
        sent = bad = 0
        for p in live:
            where = p.where
            if not (where.same_leaf and where.leaf == b.component):
                continue
            o = p.obs
            if b.what == "loss":
                sent += o.sent
                bad += o.lost
            elif o.sent > o.lost:
                sent += 1
                bad += 1 if o.slow else 0
        if (
            sent >= 50
            and bad / sent < self.config.loss_threshold / 2
            and probe_persist.ring_refutes_leaf(bad, sent, b.rate)
        ):
            b.kind = "path"
            return self._traced_uplink(b, live) if b.what == "loss" else b
        return b

    def _traced_uplink(self, b: Blame, live: list[_Path]) -> Blame:
        """Of a leaf that loses above it, the uplink its traced lossy flows name, where one stands out.

        On a real fabric a flow's reply may come back over another spine than its probe went
        (ECMP hashes each direction on its own), so a lossy cable's losses also fall on flows
        traced over the leaf's other uplinks, and the leaf out-votes the cable. The traced flows
        through the leaf still lose most on the bad uplink: that uplink is blamed when the loss
        rate of its lossy flows is at least twice that of every other uplink's (and it is
        suspect on its own), else it stays a path fault."""
        fab = self.fabric
        per: dict[str, list[int]] = {}
        for p in live:
            where = p.where
            via = p.obs.via
            if not via or b.component not in where.comps or where.same_leaf:
                continue
            link = fab.link_name(b.component, via)
            if link not in where.comps:
                continue
            acc = per.setdefault(link, [0, 0])
            acc[0] += p.obs.sent
            acc[1] += p.obs.lost
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
        """One localisation of this localiser's own window, then its conditions."""
        return self.conditions(self.localise())

    def conditions(self, blames: list[Blame]) -> list[ConditionChange]:
        """A localisation's blames into what opens, updates and resolves (with persistence and hysteresis)."""
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
