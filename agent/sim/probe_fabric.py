"""A simulated rail data plane for the probe mesh: which flows a faulty fabric drops or slows.

Given the wiring (a NIC's leaf, a leaf's spines: callables, so the simulator needs nothing of
the controller) and the faults injected (silent drop on a switch, loss or delay on a cable,
loss on a NIC's cable, a slow host), it says what happens to one flow: the spine its ECMP hash
picks (crc32 of its addresses and source port, as a switch hashes the 5-tuple), whether a
probe is lost, and how much later it comes back. The simulator's fault table puts its probe mesh
kinds here (``switch_silent_drop``, ``link_loss``, ``link_delay``, ``host_net_delay``,
``nic_cable_loss``: ``agent.sim.faults``). ``fate`` is the prober's seam
(``agent.probe.prober.FateOf``) for real agents over loopback; ``window_results`` draws a
window's results statistically, for runs on a fake clock and for benches.
"""

from __future__ import annotations

import random
import time
import zlib
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.probe.prober import PathFate, Prober
from agent.sim.fault_kinds import UnknownFault
from starpulse.v1 import service_pb2 as spb
from starpulse.v1 import telemetry_pb2 as tpb

LINK = "<->"


@dataclass
class SimProbeFabric:
    leaf_of: Callable[[str], str | None]
    spines_of: Callable[[str], Sequence[str]]
    traced: bool = True  # flows report the spine they crossed (a tracepath), else via is ""
    loss: dict[str, float] = field(default_factory=dict)  # component -> drop probability per crossing
    delay_s: dict[str, float] = field(default_factory=dict)  # component -> added round-trip seconds
    base_rtt_us: float = 8.0
    spread_us: float = 1.0  # each flow's round trip is base_rtt_us plus up to this, drawn per window
    _paths: dict[tuple[str, str, int], tuple[list[str], str]] = field(default_factory=dict, repr=False)

    def inject_loss(self, component: str, share: float) -> None:
        """``component``: a leaf or spine (silent drop), 'a<->b' (a cable), a NIC (its cable), a node."""
        self.loss[_canon(component)] = share

    def inject_delay(self, component: str, seconds: float) -> None:
        self.delay_s[_canon(component)] = seconds

    def clear_loss(self, component: str) -> None:
        self.loss.pop(_canon(component), None)

    def clear_delay(self, component: str) -> None:
        self.delay_s.pop(_canon(component), None)

    def clear(self, component: str | None = None) -> None:
        if component is None:
            self.loss.clear()
            self.delay_s.clear()
        else:
            self.loss.pop(_canon(component), None)
            self.delay_s.pop(_canon(component), None)

    def path(self, local_nic: str, peer_nic: str, src_port: int) -> tuple[list[str], str]:
        """The components a flow's probe and reply cross, and the spine it takes ("" within a leaf)."""
        key = (local_nic, peer_nic, src_port)
        known = self._paths.get(key)
        if known is None:
            known = self._paths[key] = self._path(local_nic, peer_nic, src_port)
        return known

    def _path(self, local_nic: str, peer_nic: str, src_port: int) -> tuple[list[str], str]:
        a, b = self.leaf_of(local_nic), self.leaf_of(peer_nic)
        hosts = [local_nic.rsplit("/", 1)[0], peer_nic.rsplit("/", 1)[0]]
        comps = [local_nic, peer_nic, *hosts]
        if a is None or b is None:
            return comps, ""
        if a == b:
            return [*comps, a], ""
        spines = sorted(self.spines_of(a))
        spine = spines[zlib.crc32(f"{local_nic}|{peer_nic}|{src_port}".encode()) % len(spines)] if spines else ""
        comps += [a, b]
        if spine:
            comps += [spine, _canon(f"{a}{LINK}{spine}"), _canon(f"{b}{LINK}{spine}")]
        return comps, spine

    def fate(self, local_nic: str, peer_nic: str, src_port: int) -> PathFate:
        comps, spine = self.path(local_nic, peer_nic, src_port)
        via = spine if self.traced else ""
        if not self.loss and not self.delay_s:
            return PathFate(via=via)
        keep = 1.0
        for c in comps:
            keep *= (1 - self.loss.get(c, 0.0)) ** 2  # there and back
        delay = sum(self.delay_s.get(c, 0.0) for c in comps)
        return PathFate(drop=1 - keep, delay_s=delay, via=via)

    def window_results(
        self, plan: spb.ProbePlan, rng: random.Random, *, window_s: float | None = None
    ) -> list[tpb.ProbeResult]:
        """One window of the node's plan, drawn: per flow, probes sent at the plan's rate, each lost
        with its path's probability; clean flows summed per target and spine, as the prober does."""
        span = window_s if window_s is not None else float(plan.window_s or 10)
        groups: dict[tuple[str, str, str, int], list[float]] = {}
        counts: dict[tuple[str, str, str, int], list[int]] = {}
        # No fault anywhere: every flow is clean and summed with its target's (no path to work out);
        # the same draws as the long way, so the same results
        top = self.base_rtt_us + max(0.0, self.spread_us - 1.0)  # the slowest a clean flow reads
        clean = not self.loss and not self.delay_s and not (plan.slow_us > 0 and top >= plan.slow_us)
        for t in plan.targets:
            ports = list(t.src_ports) or [0]
            per_flow = max(1, round(t.packets_per_s * span / len(ports)))
            if clean:
                key = (t.local_nic, t.peer_nic, "", 0)
                c = counts.setdefault(key, [0, 0])
                c[0] += per_flow * len(ports)
                rtts = groups.setdefault(key, [])
                rtts += [self.base_rtt_us + rng.random() * self.spread_us for _ in ports]
                continue
            for port in ports:
                fate = self.fate(t.local_nic, t.peer_nic, port)
                lost = sum(1 for _ in range(per_flow) if rng.random() < fate.drop) if fate.drop else 0
                nominal = self.base_rtt_us + fate.delay_s * 1e6
                rtt = nominal + rng.random() * self.spread_us if per_flow > lost else 0.0
                slow = plan.slow_us > 0 and (nominal >= plan.slow_us or (self.spread_us > 1.0 and rtt >= plan.slow_us))
                alone = lost > 0 or slow
                key = (t.local_nic, t.peer_nic, fate.via if alone else "", port if alone else 0)
                c = counts.setdefault(key, [0, 0])
                c[0] += per_flow
                c[1] += lost
                if per_flow > lost:
                    groups.setdefault(key, []).append(rtt)
        out = []
        for key, (sent, lost) in counts.items():
            rtts = sorted(groups.get(key, []))
            p99 = rtts[-1] if rtts else 0.0
            out.append(
                tpb.ProbeResult(
                    local_nic=key[0],
                    peer_nic=key[1],
                    via=key[2],
                    src_port=key[3],
                    sent=sent,
                    lost=lost,
                    rtt_p50_us=rtts[len(rtts) // 2] if rtts else 0.0,
                    rtt_p99_us=p99,
                    responder_us=3.0,
                    plan_version=plan.version,
                    window_ms=int(span * 1000),
                )
            )
        return out


class DrawnProber(Prober):
    """An agent's prober whose windows are drawn from the simulated data plane, not sent.

    Every ``window_s`` of its plan (on the real clock the agent reports on) it hands the agent
    the results that window would have had (``SimProbeFabric.window_results``: per flow, its
    probes lost with the probability of the faults on its path, its spine, its delay), in the
    report's own ``probe_results``, as the UDP prober does. No sockets and no thread: a cluster
    of dozens of simulated nodes in one process probes at the controller's own thresholds
    (500 us), which one process's scheduling noise would cross with real round trips.
    """

    def __init__(
        self, data_plane: SimProbeFabric, seed: int | None = None, now: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__(fate=data_plane.fate, seed=seed)
        self.data_plane = data_plane
        self._draw = random.Random(seed)
        self._now = now
        self._next_window = 0.0

    def apply(self, plan: spb.ProbePlan) -> None:
        """A newer plan: its first window starts now (an older or equal version is ignored)."""
        with self._lock:
            if plan.version and plan.version <= self.plan.version:
                return
            self.plan = plan
            self._next_window = self._now() + max(1, plan.window_s)

    def start(self) -> None:
        """Nothing to start: windows are drawn when the agent asks for them."""

    def stop(self) -> None:
        """Nothing to stop."""

    def take_results(self) -> list[tpb.ProbeResult]:
        """Every window of the plan that closed since the last call, drawn."""
        with self._lock:
            plan = self.plan
            if not plan.targets or plan.paused:
                return []
            out: list[tpb.ProbeResult] = []
            span = max(1, plan.window_s)
            while self._now() >= self._next_window:
                window = self.data_plane.window_results(plan, self._draw)
                self.sent_total += sum(r.sent for r in window)
                self.answered_total += sum(r.sent - r.lost for r in window)
                out.extend(window)
                self._next_window += span
            return out


def component(target: str) -> str:
    """Where a fault on a scenario target acts on this data plane: a switch, node or NIC by its name, a
    leaf-spine cable by its two ends in a stable order, a NIC's cable (``nic<->leaf``) as the NIC."""
    if LINK not in target:
        return target
    a, _, b = target.partition(LINK)
    nic = a if "/nic-" in a else b if "/nic-" in b else None
    return nic if nic is not None else _canon(target)


def _canon(component: str) -> str:
    """A cable's two ends in a stable order, whichever way it was named."""
    if LINK not in component:
        return component
    a, _, b = component.partition(LINK)
    tier = {"node": 0, "leaf": 3, "spine": 4}

    def rank(name: str) -> tuple[int, str]:
        if "/nic-" in name:
            return (2, name)
        return (tier.get(name.split("-", 1)[0], 9), name)

    first, second = sorted((a, b), key=rank)
    return f"{first}{LINK}{second}"


@dataclass
class PlacedFault:
    """A fault placed on one target (``agent.sim.fault_kinds.Fault``) without a scenario file."""

    target: str
    params: dict[str, Any] = field(default_factory=dict)
    targets: Sequence[str] = ()


class DataPlaneOnly:
    """The fault table's cluster surface with only a data plane behind it (no nodes, switches or agents):
    the probe mesh's kinds on a fake-clock fleet (``bench.probe_mesh``). Anything else is refused."""

    def __init__(self, plane: SimProbeFabric) -> None:
        self.plane = plane
        self._held: dict[Hashable, int] = {}

    def data_plane(self) -> SimProbeFabric:
        return self.plane

    def hold(self, what: Hashable) -> bool:
        self._held[what] = self._held.get(what, 0) + 1
        return self._held[what] == 1

    def release(self, what: Hashable) -> bool:
        left = self._held.get(what, 0) - 1
        if left < 0:
            return False
        if left == 0:
            del self._held[what]
        else:
            self._held[what] = left
        return left == 0

    def _refuse(self, *args: object) -> Any:
        raise UnknownFault("only the probe mesh's fault kinds act on a data plane alone")

    shape = node = cut_cables = mend_cables = silence = unsilence = halt = revive = switch_port = switch = _refuse
