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
window; it becomes a condition after ``persist_windows`` localisations in a row name it, and
resolves after ``clear_windows`` in a row do not.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import structlog

from controller.detect.model import ComponentType, Condition, ConditionChange
from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core import vocab
from starpulse.core.clock import Clock
from starpulse.v1 import telemetry_pb2 as tpb

log = structlog.get_logger(__name__)

_TIE = 0.9  # votes within 10 % of the most are a tie
RULE_LOSS = "probe.loss"
RULE_DELAY = "probe.delay"


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


class ProbeLocaliser:
    """Holds the window's observations and turns them into conditions (see the module docstring)."""

    def __init__(
        self,
        fabric: Fabric,
        config: ProbeConfig,
        *,
        clock: Clock,
        node_ok: Callable[[str, int], bool] = lambda node, since_ms: True,
        every_s: float = 5.0,
    ) -> None:
        """``node_ok(node, since_ms)``: the node is online and was connected before ``since_ms``."""
        self.fabric = fabric
        self.config = config
        self.clock = clock
        self.node_ok = node_ok
        self.every_s = every_s
        # (local NIC, peer NIC, via) -> its windows' results, oldest first: (received ms, result)
        self._window: dict[tuple[str, str, str], deque[tuple[int, ProbeObs]]] = {}
        self._comps: dict[tuple[str, str, str], _Where | None] = {}
        self._spreads: dict[tuple[str, str], tuple[tuple[str, float], ...]] = {}  # leaf pair -> shares
        self._streak: dict[tuple[str, str], int] = {}  # (rule, component) -> localisations in a row
        self._clean: dict[tuple[str, str], int] = {}
        self._open: dict[tuple[str, str], Condition] = {}
        self._last_run = clock.monotonic()
        self.last_blames: list[Blame] = []
        # Every probed component's health over the last window (the dashboard's colours, the
        # CLI's worst links): kind, sent, lost, loss share, the worst network p99 through it.
        self.health: dict[str, dict[str, Any]] = {}

    # -- input ---------------------------------------------------------------------------
    def add(self, node: str, obs: list[ProbeObs]) -> None:
        """A report's results; a restarted peer's are left out (its losses were its restart)."""
        now = self.clock.time_ms()
        for o in obs:
            if not o.restarted:
                key = (o.local_nic, o.peer_nic, o.via)
                q = self._window.get(key)
                if q is None:
                    q = self._window[key] = deque()
                q.append((now, o))

    def forget_paths(self) -> None:
        """The fabric's wiring changed: paths are worked out again."""
        self._comps.clear()

    def due(self) -> bool:
        now = self.clock.monotonic()
        if now - self._last_run < self.every_s:
            return False
        self._last_run = now
        return True

    # -- localisation ----------------------------------------------------------------------
    def localise(self) -> list[Blame]:
        """The components to blame for what the window holds (no state changes)."""
        now = self.clock.time_ms()
        horizon = now - int(self.config.localise_window_s * 1000)
        paths = self._paths(horizon)
        self.health = self._health(paths)
        blames = self._vote(paths, "loss")
        explained = {b.component for b in blames}
        slow = [p for p in paths if not explained.intersection(p.comps)]
        blames += self._vote(slow, "delay")
        return [self._uplink_or_leaf(b, paths) for b in blames]

    def _paths(self, horizon: int) -> list[_Path]:
        """One path per (local NIC, peer NIC, spine) with its window's results summed."""
        ok: dict[str, bool] = {}
        out: list[_Path] = []
        for key in list(self._window):
            q = self._window[key]
            while q and q[0][0] < horizon:
                q.popleft()
            if not q:
                del self._window[key]
                continue
            found = self._path_of(key)
            if found is None:
                continue
            a, b = found.hosts
            for n in (a, b):
                if n not in ok:
                    ok[n] = self.node_ok(n, horizon)
            if not (ok[a] and ok[b]):
                continue
            sent = lost = 0
            p99 = responder = 0.0
            for _, o in q:
                sent += o.sent
                lost += o.lost
                if o.sent > o.lost:
                    p99 = max(p99, o.rtt_p99_us)
                    responder = max(responder, o.responder_us)
            obs = ProbeObs(key[0], key[1], key[2], sent, lost, p99, responder, False)
            out.append(_Path(obs, found.comps, found.same_leaf, found.leaf, found.spread))
        return out

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
                if b != a:
                    comps.append(b)
                if lb != la:
                    comps.append(lb)
                    if via and via in fab and fab.kind(via) == "spine":
                        comps += [via, fab.link_name(la, via), fab.link_name(lb, via)]
                    elif not via:
                        spread = self._spread(la, lb)
                found = _Where(tuple(comps), la == lb, la, (a, b), spread)
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

    @staticmethod
    def _spread_out(acc: dict[str, float], pending: dict[int, list[Any]]) -> None:
        """Add what summed results carried between leaf pairs to their spines and cables, once per pair."""
        for spread, total in pending.values():
            for c, share in spread:
                acc[c] = acc.get(c, 0.0) + total * share

    def _health(self, paths: list[_Path]) -> dict[str, dict[str, Any]]:
        acc: dict[str, list[float]] = {}  # component -> [sent, lost, worst p99]
        pending: dict[int, list[Any]] = {}
        for p in paths:
            o = p.obs
            for c in p.comps:
                a = acc.get(c)
                if a is None:
                    a = acc[c] = [0, 0, 0.0]
                a[0] += o.sent
                a[1] += o.lost
                if o.sent > o.lost and o.rtt_p99_us > a[2]:
                    a[2] = o.rtt_p99_us
            if p.spread:
                slot = pending.get(id(p.spread))
                if slot is None:
                    pending[id(p.spread)] = [p.spread, o.sent]
                else:
                    slot[1] += o.sent
        spread_sent: dict[str, float] = {}
        self._spread_out(spread_sent, pending)
        for c, extra in spread_sent.items():
            a = acc.get(c)
            if a is None:
                a = acc[c] = [0, 0, 0.0]
            a[0] += extra
        return {
            c: {
                "kind": self._kind(c),
                "sent": int(sent),
                "lost": int(lost),
                "loss": round(lost / sent, 5) if sent else 0.0,
                "p99_us": round(p99, 1),
            }
            for c, (sent, lost, p99) in acc.items()
        }

    def worst(self, limit: int = 10, kinds: tuple[str, ...] = ("link", "leaf", "spine")) -> list[dict[str, Any]]:
        """The most lossy (then slowest) probed components of these kinds, worst first."""
        rows = [{"component": c, **h} for c, h in self.health.items() if h["kind"] in kinds]
        rows.sort(key=lambda r: (-r["loss"], -r["p99_us"], r["component"]))
        return rows[:limit]

    def _vote(self, paths: list[_Path], what: str) -> list[Blame]:
        cfg = self.config
        blames: list[Blame] = []
        min_bad = cfg.min_lost if what == "loss" else 3
        min_rate = cfg.loss_threshold if what == "loss" else 0.5
        bad_paths = [p for p in paths if self._badness(p.obs, what)[0]]
        if not bad_paths:
            return blames  # a clean fabric costs one pass
        sent = self._count(paths, what, 1)  # the denominators: everything through each component
        left = paths
        for _ in range(16):  # at most this many faults named at once
            if not bad_paths:
                break
            lost: dict[str, int] = {}
            for p in bad_paths:
                bad = self._badness(p.obs, what)[0]
                for c in p.comps:
                    lost[c] = lost.get(c, 0) + bad
            suspects = [c for c, v in lost.items() if v >= min_bad and v / max(1, sent[c]) >= min_rate]
            if not suspects:
                break
            top = max(lost[c] for c in suspects)
            tied = [c for c in suspects if lost[c] >= _TIE * top]
            best = max(tied, key=lambda c: (lost[c] / max(1, sent[c]), lost[c], c))
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
            gone = [p for p in left if best in p.comps]
            for c, v in self._count(gone, what, -1).items():
                sent[c] = sent.get(c, 0.0) + v
            left = [p for p in left if best not in p.comps]
            bad_paths = [p for p in bad_paths if best not in p.comps]
        return blames

    def _count(self, paths: list[_Path], what: str, sign: int) -> dict[str, float]:
        """Traffic through each component (summed results spread over spines once per leaf pair)."""
        sent: dict[str, float] = {}
        pending: dict[int, list[Any]] = {}
        for p in paths:
            total = sign * self._badness(p.obs, what)[1]
            for c in p.comps:
                sent[c] = sent.get(c, 0.0) + total
            if p.spread:
                slot = pending.get(id(p.spread))
                if slot is None:
                    pending[id(p.spread)] = [p.spread, total]
                else:
                    slot[1] += total
        self._spread_out(sent, pending)
        return sent

    def _badness(self, o: ProbeObs, what: str) -> tuple[int, int]:
        if what == "loss":
            return o.lost, o.sent
        answered = o.sent > o.lost
        return (1 if answered and o.rtt_p99_us >= self.config.rtt_threshold_us else 0), (1 if answered else 0)

    def _kind(self, name: str) -> str:
        if "<->" in name:
            return "link"
        return self.fabric.kind(name)

    def _uplink_or_leaf(self, b: Blame, paths: list[_Path]) -> Blame:
        """A leaf whose same-leaf pairs are clean lost its probes above it: an untraced uplink."""
        if b.kind != "leaf":
            return b
        inside = [p.obs for p in paths if p.same_leaf and p.leaf == b.component]
        sent = sum(o.sent for o in inside)
        if b.what == "loss":
            bad = sum(o.lost for o in inside)
        else:
            bad = sum(self._badness(o, "delay")[0] for o in inside)
            sent = sum(self._badness(o, "delay")[1] for o in inside)
        if sent >= 50 and bad / sent < self.config.loss_threshold / 2:
            b.kind = "path"
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
        for key, b in named.items():
            self._clean.pop(key, None)
            self._streak[key] = self._streak.get(key, 0) + 1
            cond = self._open.get(key)
            if cond is not None:
                cond.last_seen_ms = now
                cond.count += 1
                cond.evidence.update(self._evidence(b))
                cond.message = self._message(b)
                changes.append(ConditionChange("updated", cond))
            elif self._streak[key] >= self.config.persist_windows:
                cond = self._condition(key[0], b, now)
                self._open[key] = cond
                changes.append(ConditionChange("opened", cond))
                log.warning("probe_fault", component=b.component, kind=b.kind, what=b.what, loss=round(b.rate, 4))
        for key in list(self._streak):
            if key not in named:
                del self._streak[key]
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
            rule=rule,
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
