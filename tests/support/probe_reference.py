"""The localiser before running sums (one pass over the whole window per localisation), kept as
the oracle the running-sums localiser is checked against (tests/controller/detect/test_probe_sums.py)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from controller.detect.probe_background import stands_out
from controller.detect.probes import Blame, ProbeObs
from controller.fabric.model import Fabric
from controller.fabric.probeplan import ProbeConfig
from starpulse.core.clock import Clock

_TIE = 0.9  # votes within 10 % of the most are a tie


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


class ReferenceLocaliser:
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
        self._last_run = clock.monotonic()
        self.last_blames: list[Blame] = []
        # Every probed component's health over the last window (the dashboard's colours, the
        # CLI's worst links): kind, sent, lost, loss share, the worst network p99 through it.
        self.health: dict[str, dict[str, Any]] = {}
        self.background_loss: float | None = None

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
        total = sum(p.obs.sent for p in paths)
        self.background_loss = sum(p.obs.lost for p in paths) / total if total else None
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
        alpha = cfg.background_alpha / max(1, sum(1 for v in sent.values() if v > 1e-9))
        judged = what == "loss" and bool(self.background_loss)
        left = paths
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
                if v >= min_bad
                and v / max(1, sent[c]) >= min_rate
                and (not judged or stands_out(v, sent[c], self.background_loss or 0.0, alpha))
            ]
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
