"""Who probes whom: a probe mesh planned from the fabric graph (issue 29).

Three kinds of target per NIC, each over several flows (UDP source ports, the ECMP hash input):

- ``hostping``: the node's next NIC on another rail (Hostping, NSDI'23). Rails meet only at the
  spines, so the path is leaf -> spine -> leaf: one host tests its own uplinks with no one else,
  and a one-block fabric (no other block to pair with) still covers every leaf-spine link.
- ``leaf``: the next NIC under the same leaf (a ring over the leaf's NICs), which never leaves
  the leaf: loss there is the leaf's or a NIC's, never an uplink's. A leaf with fewer than
  ``min_leaf_nics`` probing NICs gets no ring (with two NICs one bad NIC fails every pair under
  the leaf, R-Pingmesh's author's caveat); its NICs get one more cross target instead, and
  localisation never blames a leaf on pairs under it alone (controller.detect.probes).
- ``cross``: NICs on the same rail in other blocks (ring offsets 1, 2, ... over the rail's
  leaves), so every leaf sends and receives flows over every spine.

Flows per target follow R-Pingmesh's ECMP sizing (Eq. 1): the fewest source ports that hit
all of a leaf's ``k`` uplinks with probability ``ecmp_cover_p``, capped at 64. Rates come
from a per-NIC budget of packets per second split over the NIC's targets, then scaled down
wherever a NIC would receive more than the budget, so no NIC sends or answers more than it.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

import structlog

from controller.fabric.model import Fabric
from starpulse.core.schema import setting
from starpulse.v1 import service_pb2 as spb

log = structlog.get_logger(__name__)

ProbeWhere = Literal["always", "thin_on_jobs", "idle_only"]
_EPHEMERAL = 49152
_MAX_FLOWS = 64


@dataclass
class ProbeConfig:
    """The probe mesh: who probes whom, how much, and where it pauses."""

    enabled: bool = setting(
        False, "Plan a probe mesh over the declared fabric and push it to agents (needs a fabric file)"
    )
    packets_per_s_per_nic: float = setting(
        20.0,
        "Probes per second each NIC sends (and at most answers): 600 per NIC in a 30 s window, so 1 % loss "
        "on a NIC's cable shows ~12 lost round trips, and a 16-NIC leaf sees ~9,600 probes (~190 lost)",
        gt=0,
    )
    ecmp_cover_p: float = setting(
        0.9, "Probability that one target's flows cover all of a leaf's uplinks (R-Pingmesh Eq. 1)", gt=0, le=0.999
    )
    cross_targets: int = setting(2, "NICs on the same rail in other blocks each NIC probes", ge=0, le=16)
    min_leaf_nics: int = setting(
        3, "NICs a leaf needs for a same-leaf ring; fewer: one more cross target instead", ge=2
    )
    where: ProbeWhere = setting(
        "always",
        "always; thin_on_jobs (a job's nodes probe at a quarter of the budget); idle_only (never on a job's nodes)",
    )
    port: int = setting(18515, "UDP port every node's responder answers on", ge=1, le=65535)
    dscp: int = setting(26, "DSCP of the RoCE traffic class the probes ride in", ge=0, le=63)
    mtu_bytes: int = setting(4200, "Rail MTU: probes are this size on the wire (IP and UDP headers included)", ge=64)
    timeout_ms: int = setting(500, "A probe with no reply by then is lost", ge=1)
    window_s: int = setting(10, "Seconds the agent sums results over; each report carries the last window", ge=1)
    address_template: str = setting(
        "10.{rail}.{block}.{slot}",
        "A NIC's rail address when the fabric file gives none (NIC attribute 'address'): "
        "{rail}, {block}, {slot} (the node's place in its block), {node} (its place in the fabric)",
        nonempty=True,
    )
    replan_min_s: float = setting(30.0, "Seconds between replans when the fleet keeps changing", ge=0)
    localise_window_s: float = setting(
        30.0, "Seconds of results localisation reads (R-Pingmesh's aggregation window)", gt=0
    )
    localise_every_s: float = setting(
        5.0,
        "Seconds between localisations: each reads the last localise_window_s (a sliding window), so a fault "
        "is named persist_windows times in a row within persist_windows x this of its evidence sufficing",
        gt=0,
    )
    loss_threshold: float = setting(0.005, "Loss share at which a component is suspect (0.5 %)", gt=0, le=0.5)
    min_lost: int = setting(6, "Lost probes a component needs before it is suspect", ge=1)
    background_alpha: float = setting(
        0.001,
        "False-alarm probability, fabric-wide per localisation, of calling a component's loss above the "
        "fabric's background (a Poisson test split over the components tested)",
        gt=0,
        lt=1,
    )
    rtt_threshold_us: float = setting(
        500.0, "Network p99 round trip at which a component is slow (R-Pingmesh's SLA: 500 us)", gt=0
    )
    persist_windows: int = setting(2, "Consecutive localisations naming a component before it is a condition", ge=1)
    clear_windows: int = setting(3, "Consecutive clean localisations before its condition resolves", ge=1)


def flows_for(paths: int, cover_p: float) -> int:
    """Fewest flows that hit all ``paths`` equal-cost paths with probability ``cover_p``, at most 64.

    Inclusion-exclusion over the paths missed (R-Pingmesh's Eq. 1); 1 path needs 1 flow.
    """
    if paths <= 1:
        return 1
    for flows in range(paths, _MAX_FLOWS + 1):
        p = sum((-1) ** j * math.comb(paths, j) * (1 - j / paths) ** flows for j in range(paths + 1))
        if p >= cover_p:
            return flows
    return _MAX_FLOWS


@dataclass
class PlannedTarget:
    local_nic: str
    peer_nic: str
    purpose: str
    src_ports: list[int]
    packets_per_s: float = 0.0


@dataclass
class MeshPlan:
    """The whole mesh: every node's targets and every NIC's address."""

    version: int
    targets: dict[str, list[PlannedTarget]] = field(default_factory=dict)  # node -> its targets
    addresses: dict[str, str] = field(default_factory=dict)  # NIC -> rail address
    paused: set[str] = field(default_factory=set)

    def for_node(self, node: str, config: ProbeConfig) -> spb.ProbePlan:
        """The node's part, as pushed on its stream."""
        plan = spb.ProbePlan(
            version=self.version,
            paused=node in self.paused,
            port=config.port,
            dscp=config.dscp,
            payload_bytes=max(16, config.mtu_bytes - 28),
            timeout_ms=config.timeout_ms,
            window_s=config.window_s,
            slow_us=config.rtt_threshold_us,
        )
        for t in self.targets.get(node, []):
            plan.listen[t.local_nic] = self.addresses[t.local_nic]
            plan.targets.add(
                local_nic=t.local_nic,
                local_address=self.addresses[t.local_nic],
                peer_nic=t.peer_nic,
                peer_address=self.addresses[t.peer_nic],
                src_ports=t.src_ports,
                packets_per_s=t.packets_per_s,
                purpose=t.purpose,
            )
        return plan

    def sent_pps(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for ts in self.targets.values():
            for t in ts:
                out[t.local_nic] = out.get(t.local_nic, 0.0) + t.packets_per_s
        return out

    def received_pps(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for ts in self.targets.values():
            for t in ts:
                out[t.peer_nic] = out.get(t.peer_nic, 0.0) + t.packets_per_s
        return out


def nic_addresses(fabric: Fabric, nics: Iterable[str], template: str) -> dict[str, str]:
    """Each NIC's rail address: the fabric's own ('address' on the NIC), else the template's."""
    place = {n: i for i, n in enumerate(fabric.nodes())}
    slots: dict[str, int] = {}
    for block in fabric.blocks():
        for i, n in enumerate(fabric.nodes_in_block(block)):
            given = fabric.graph.nodes[n].get("slot")
            slots[n] = given if isinstance(given, int) and not isinstance(given, bool) else i
    out: dict[str, str] = {}
    for nic in nics:
        given = fabric.graph.nodes[nic].get("address")
        if isinstance(given, str) and given:
            out[nic] = given
            continue
        host = fabric.host_of(nic)
        out[nic] = template.format(
            rail=fabric.rail_of(nic), block=fabric.block_of(host), slot=slots[host], node=place[host]
        )
    return out


def _ports(local: str, flows: int) -> list[int]:
    """``flows`` consecutive source ports from a place in the ephemeral range stable per NIC.

    The same ports for all of a NIC's targets: the agent binds one socket per port (the
    destination is in the ECMP hash too, so each pair's flows still spread), and an ECMP
    hash spreads consecutive ports as well as any others.
    """
    start = _EPHEMERAL + zlib.crc32(local.encode()) % (16384 - flows)
    return list(range(start, start + flows))


def plan_mesh(
    fabric: Fabric,
    config: ProbeConfig,
    *,
    nodes: Iterable[str] | None = None,
    busy: Callable[[str], bool] = lambda node: False,
    version: int = 1,
) -> MeshPlan:
    """Plan the mesh over ``nodes`` (None: every node in the fabric); ``busy``: a job runs there."""
    eligible = set(fabric.nodes() if nodes is None else nodes) & set(fabric.nodes())
    paused = {n for n in eligible if config.where == "idle_only" and busy(n)}
    probing = sorted(eligible - paused)
    plan = MeshPlan(version=version, paused=paused)
    nics = [nic for n in probing for nic in fabric.nics_of(n) if fabric.leaf_of(nic) is not None]
    plan.addresses = nic_addresses(fabric, nics, config.address_template)
    pairs: dict[str, list[tuple[str, str]]] = {nic: [] for nic in nics}  # nic -> (peer, purpose)
    _hostping(fabric, probing, plan.addresses, pairs)
    few = _same_leaf(fabric, set(probing), config.min_leaf_nics, pairs)
    _cross(fabric, plan.addresses, few, config.cross_targets, pairs)

    spines = max((len(fabric.spines_of(leaf)) for leaf in fabric.leaves()), default=1)
    flows = flows_for(spines, config.ecmp_cover_p)
    budget = config.packets_per_s_per_nic
    for node in probing:
        plan.targets[node] = []
    for nic, peers in pairs.items():
        if not peers:
            continue
        scale = 0.25 if config.where == "thin_on_jobs" and busy(fabric.host_of(nic)) else 1.0
        each = budget * scale / len(peers)
        ports = _ports(nic, flows)
        for peer, purpose in peers:
            plan.targets[fabric.host_of(nic)].append(PlannedTarget(nic, peer, purpose, ports, packets_per_s=each))
    # No NIC answers more than the budget: scale down what is aimed at an over-subscribed one.
    received = plan.received_pps()
    for ts in plan.targets.values():
        for t in ts:
            got = received.get(t.peer_nic, 0.0)
            if got > budget:
                t.packets_per_s *= budget / got
    log.info(
        "probe_mesh_planned",
        version=version,
        nodes=len(probing),
        paused=len(paused),
        targets=sum(len(t) for t in plan.targets.values()),
        flows_per_target=flows,
    )
    return plan


def _hostping(
    fabric: Fabric, probing: list[str], addresses: dict[str, str], pairs: dict[str, list[tuple[str, str]]]
) -> None:
    """Each node's NICs in a ring across rails: leaf -> spine -> leaf, with no one else."""
    for node in probing:
        own = sorted((n for n in fabric.nics_of(node) if n in addresses), key=fabric.rail_of)
        if len(own) >= 2:
            for i, nic in enumerate(own):
                pairs[nic].append((own[(i + 1) % len(own)], "hostping"))


def _same_leaf(fabric: Fabric, on: set[str], min_nics: int, pairs: dict[str, list[tuple[str, str]]]) -> set[str]:
    """A ring over each leaf's probing NICs where there are enough; returns the NICs of leaves with too few."""
    few: set[str] = set()
    for leaf in fabric.leaves():
        under = [n for n in fabric.nics_on_leaf(leaf) if fabric.host_of(n) in on]
        if len(under) >= min_nics:
            for i, nic in enumerate(under):
                pairs[nic].append((under[(i + 1) % len(under)], "leaf"))
        else:
            few.update(under)
    return few


def _cross(
    fabric: Fabric,
    addresses: dict[str, str],
    few: set[str],
    targets: int,
    pairs: dict[str, list[tuple[str, str]]],
) -> None:
    """Same rail, other blocks: ring offsets 1..targets over the rail's leaves with probing NICs."""
    by_rail: dict[int, list[list[str]]] = {}
    for leaf in sorted(fabric.leaves(), key=lambda lf: (fabric.graph.nodes[lf]["rail"], fabric.block_of(lf))):
        under = [n for n in fabric.nics_on_leaf(leaf) if n in addresses]
        if under:
            by_rail.setdefault(int(fabric.graph.nodes[leaf]["rail"]), []).append(under)
    for leaves in by_rail.values():
        if len(leaves) < 2:
            continue
        for li, under in enumerate(leaves):
            for si, nic in enumerate(under):
                want = targets + (1 if nic in few else 0)
                for d in range(1, min(want, len(leaves) - 1) + 1):
                    other = leaves[(li + d) % len(leaves)]
                    pairs[nic].append((other[si % len(other)], "cross"))
